"""SwiGLU gate: correctness against PyTorch over several shapes and dtypes, then perf records."""
from __future__ import annotations

import pytest

from .. import common
from ..common import torch

pytestmark = common.requires_cuda


def reference(a, b):
    """silu(a) * b in fp32, cast back to the input dtype."""
    return (torch.nn.functional.silu(a.float()) * b.float()).to(a.dtype)


def reference64(a, b):
    return torch.nn.functional.silu(a.double()) * b.double()


def cutile_impl():
    from tilesuite.ops.cutile.swiglu import swiglu

    return swiglu


CASES = [
    ((1, 64), torch.float32),
    ((3, 1000), torch.float16),  # tail inside the last tile
    ((128, 4096), torch.bfloat16),
    ((2, 5, 3000), torch.float16),  # 3-D input, odd sizes
    ((257, 14336), torch.bfloat16),
    ((64, 1536), torch.float32),
]
PERF_CASES = [((8192, 14336), torch.bfloat16), ((32768, 4096), torch.float16)]


class Test_SwiGLU:
    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(CASES))
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_op(self, shape, dtype, backend):
        a = common.randn(shape, dtype, seed=1, scale=3.0)
        b = common.randn(shape, dtype, seed=2)
        common.assert_close(cutile_impl()(a, b), reference(a, b), dtype)

    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(PERF_CASES))
    @pytest.mark.parametrize("framework", common.PERF_FRAMEWORKS)
    def test_perf(self, shape, dtype, framework, record_property):
        a = common.randn(shape, dtype, seed=3)
        b = common.randn(shape, dtype, seed=4)
        if framework == "cutile":
            impl = cutile_impl()
            common.assert_close(impl(a, b), reference(a, b), dtype)
            fn = lambda: impl(a, b)  # noqa: E731
            # Timed calls are checked too: first and last, on fresh inputs (bench.OutputCheck).
            checked = dict(inputs=(a, b), reference=lambda: reference(a, b), dtype=dtype)
        else:
            checked = {}
            fn = lambda: torch.nn.functional.silu(a) * b  # noqa: E731
        common.record_benchmark(record_property, framework, fn, **checked)

    # A few correctness shapes plus every perf shape: a kernel that special-cases the benchmark is caught there.
    @pytest.mark.defence
    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(CASES[1:4] + PERF_CASES))
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_defence(self, shape, dtype, backend):
        def make(seed):
            return common.randn(shape, dtype, seed=seed, scale=3.0), common.randn(shape, dtype, seed=seed + 1)

        common.defence_run(cutile_impl(), make, reference64, shape, dtype, mutate=common.mutate_rows)
