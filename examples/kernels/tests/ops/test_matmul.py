"""Matmul: correctness against an fp32 reference (tails, strided inputs), then perf records."""
from __future__ import annotations

import pytest

from .. import common
from ..common import torch


def reference(a, b):
    """fp32 product rounded once to the input dtype, like a kernel that accumulates in fp32."""
    return (a.float() @ b.float()).to(a.dtype)


def cutile_impl():
    from tilesuite.ops.cutile.matmul import matmul

    return matmul


def make_inputs(m, n, k, dtype, *, seed):
    # Scaled so every output element is ~N(0, 1) whatever K is: one tolerance fits all shapes.
    a = common.randn((m, k), dtype, seed=seed, scale=k ** -0.5)
    b = common.randn((k, n), dtype, seed=seed + 1)
    return a, b


# (M, N, K, dtype): exact tiles, tails in every dimension, tiny and realistic shapes.
CASES = [
    (128, 128, 128, torch.float16),
    (1024, 1024, 1023, torch.bfloat16),  # K tail: last K tile is zero-padded
    (1000, 1000, 1000, torch.float16),  # M, N and K all off the tile grid
    (257, 129, 65, torch.bfloat16),  # one row/column past a tile boundary
    (8, 8, 8, torch.bfloat16),  # smaller than one tile in every dimension
    (1, 4096, 4096, torch.float16),  # a single row (decode-like GEMV shape)
    (3072, 6144, 2720, torch.bfloat16),
    (4096, 4096, 4096, torch.float16),
]
PERF_CASES = [
    (4096, 4096, 4096, torch.bfloat16),
    (8192, 8192, 8192, torch.bfloat16),
    (4096, 4096, 4096, torch.float16),
    (3072, 6144, 2720, torch.bfloat16),
]


def case_id(m, n, k, dtype):
    return f"{m}x{n}x{k}-{common.dtype_id(dtype)}"


def tflops(m, n, k, ms):
    """Throughput of one m x n x k product that took ``ms`` milliseconds."""
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


class Test_Matmul_Inputs:
    """Input validation runs on the host, so these run without a GPU."""

    def test_rejects_mismatched_inner_dims(self):
        with pytest.raises(ValueError, match="inner dimensions"):
            cutile_impl()(torch.empty(4, 5, dtype=torch.float16), torch.empty(6, 4, dtype=torch.float16))

    def test_rejects_fp32(self):
        with pytest.raises(TypeError, match="fp16/bf16"):
            cutile_impl()(torch.empty(4, 4), torch.empty(4, 4))

    def test_rejects_mixed_dtypes(self):
        with pytest.raises(TypeError, match="fp16/bf16"):
            cutile_impl()(torch.empty(4, 4, dtype=torch.float16), torch.empty(4, 4, dtype=torch.bfloat16))

    def test_rejects_3d(self):
        with pytest.raises(ValueError, match="2-D"):
            cutile_impl()(torch.empty(2, 4, 4, dtype=torch.float16), torch.empty(4, 4, dtype=torch.float16))


@common.requires_cuda
class Test_Matmul:
    @pytest.mark.parametrize("m, n, k, dtype", [pytest.param(*c, id=case_id(*c)) for c in CASES])
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_op(self, m, n, k, dtype, backend):
        a, b = make_inputs(m, n, k, dtype, seed=10)
        common.assert_close(cutile_impl()(a, b), reference(a, b), dtype)

    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_op_strided_inputs(self, backend):
        """A transposed (column-major) B and a row-sliced A: the kernel must honour strides."""
        k = 384
        a_full = common.randn((600, k), torch.float16, seed=20, scale=k ** -0.5)
        b_t = common.randn((320, k), torch.float16, seed=21)  # stored (N, K); .t() is a (K, N) view
        a, b = a_full[100:], b_t.t()
        common.assert_close(cutile_impl()(a, b), reference(a, b), torch.float16)

    @pytest.mark.parametrize("m, n, k, dtype", [pytest.param(*c, id=case_id(*c)) for c in PERF_CASES])
    @pytest.mark.parametrize("framework", common.PERF_FRAMEWORKS)
    def test_perf(self, m, n, k, dtype, framework, record_property):
        a, b = make_inputs(m, n, k, dtype, seed=30)
        if framework == "cutile":
            impl = cutile_impl()
            common.assert_close(impl(a, b), reference(a, b), dtype)
            fn = lambda: impl(a, b)  # noqa: E731
            # Timed calls are checked too: first and last, on fresh inputs (bench.OutputCheck).
            checked = dict(inputs=(a, b), reference=lambda: reference(a, b), dtype=dtype)
        else:
            checked = {}
            fn = lambda: torch.matmul(a, b)  # noqa: E731  cuBLAS: the bar to reach
        record = common.record_benchmark(record_property, framework, fn, **checked)
        record_property("tflops", round(tflops(m, n, k, record[framework]["forward"]["median"]), 1))
