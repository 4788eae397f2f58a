"""LayerNorm: correctness against PyTorch over several shapes and dtypes, then perf records."""
from __future__ import annotations

import pytest

from .. import common
from ..common import torch

pytestmark = common.requires_cuda


def reference(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(x.float(), x.shape[-1:], weight.float(), bias.float(), eps).to(x.dtype)


def reference64(x, weight, bias, eps=1e-5):
    return torch.nn.functional.layer_norm(x.double(), x.shape[-1:], weight.double(), bias.double(), eps)


def cutile_impl():
    from tilesuite.ops.cutile.layer_norm import layer_norm

    return layer_norm


CASES = [
    ((1, 96), torch.float32),
    ((64, 1000), torch.float16),
    ((256, 4096), torch.bfloat16),
    ((2, 9, 777), torch.float16),  # 3-D input, tail
    ((31, 10000), torch.float32),
    ((1024, 2048), torch.float16),
]
PERF_CASES = [((262144, 1024), torch.float16), ((32768, 8192), torch.bfloat16)]


class Test_LayerNorm:
    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(CASES))
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_op(self, shape, dtype, backend):
        # A mean far from zero catches the E[x^2] - E[x]^2 cancellation.
        x = common.randn(shape, dtype, seed=1, scale=2.0, shift=8.0)
        weight = common.randn(shape[-1:], dtype, seed=2)
        bias = common.randn(shape[-1:], dtype, seed=3)
        common.assert_close(cutile_impl()(x, weight, bias, 1e-5), reference(x, weight, bias, 1e-5), dtype)

    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(PERF_CASES))
    @pytest.mark.parametrize("framework", common.PERF_FRAMEWORKS)
    def test_perf(self, shape, dtype, framework, record_property):
        x = common.randn(shape, dtype, seed=4)
        weight = common.randn(shape[-1:], dtype, seed=5)
        bias = common.randn(shape[-1:], dtype, seed=6)
        if framework == "cutile":
            impl = cutile_impl()
            common.assert_close(impl(x, weight, bias, 1e-5), reference(x, weight, bias, 1e-5), dtype)
            fn = lambda: impl(x, weight, bias, 1e-5)  # noqa: E731
            # Timed calls are checked too: first and last, on fresh inputs (bench.OutputCheck).
            checked = dict(inputs=(x, weight, bias), reference=lambda: reference(x, weight, bias, 1e-5), dtype=dtype)
        else:
            checked = {}
            fn = lambda: torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, 1e-5)  # noqa: E731
        common.record_benchmark(record_property, framework, fn, **checked)

    # A few correctness shapes plus every perf shape: a kernel that special-cases the benchmark is caught there.
    @pytest.mark.defence
    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(CASES[1:4] + PERF_CASES))
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_defence(self, shape, dtype, backend):
        def make(seed):
            return (common.randn(shape, dtype, seed=seed, scale=2.0, shift=8.0),
                    common.randn(shape[-1:], dtype, seed=seed + 1), common.randn(shape[-1:], dtype, seed=seed + 2))

        common.defence_run(lambda x, w, b: cutile_impl()(x, w, b, 1e-5), make, reference64, shape, dtype,
                           mutate=common.mutate_rows)
