"""RMSNorm: correctness against PyTorch over several shapes and dtypes, then perf records."""
from __future__ import annotations

import pytest

from .. import common
from ..common import torch

pytestmark = common.requires_cuda


def reference(x, weight, eps):
    """Hugging Face's RMSNorm: statistics in fp32, result cast back before the weight multiply."""
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


def reference64(x, weight, eps=1e-6):
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def cutile_impl():
    from tilesuite.ops.cutile.rms_norm import rms_norm

    return rms_norm


CASES = [
    ((1, 128), torch.float32),
    ((64, 1000), torch.float16),  # tail: 1000 is not a multiple of any tile
    ((300, 4096), torch.bfloat16),
    ((4, 7, 777), torch.float16),  # 3-D input, odd rows and columns
    ((1024, 8192), torch.float16),
    ((17, 12288), torch.float32),
]
PERF_CASES = [((262144, 1024), torch.float16), ((65536, 4096), torch.bfloat16)]


class Test_RMSNorm:
    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(CASES))
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_op(self, shape, dtype, backend):
        x = common.randn(shape, dtype, seed=1, scale=2.0, shift=0.5)
        weight = common.randn(shape[-1:], dtype, seed=2)
        common.assert_close(cutile_impl()(x, weight, 1e-6), reference(x, weight, 1e-6), dtype)

    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(PERF_CASES))
    @pytest.mark.parametrize("framework", common.PERF_FRAMEWORKS)
    def test_perf(self, shape, dtype, framework, record_property):
        x = common.randn(shape, dtype, seed=3)
        weight = common.randn(shape[-1:], dtype, seed=4)
        if framework == "cutile":
            impl = cutile_impl()
            common.assert_close(impl(x, weight, 1e-6), reference(x, weight, 1e-6), dtype)
            fn = lambda: impl(x, weight, 1e-6)  # noqa: E731
            # Timed calls are checked too: first and last, on fresh inputs (bench.OutputCheck).
            checked = dict(inputs=(x, weight), reference=lambda: reference(x, weight, 1e-6), dtype=dtype)
        else:
            checked = {}
            fn = lambda: reference(x, weight, 1e-6)  # noqa: E731
        common.record_benchmark(record_property, framework, fn, **checked)

    # A few correctness shapes plus every perf shape: a kernel that special-cases the benchmark is caught there.
    @pytest.mark.defence
    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(CASES[1:4] + PERF_CASES))
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_defence(self, shape, dtype, backend):
        def make(seed):
            return (common.randn(shape, dtype, seed=seed, scale=2.0, shift=0.5),
                    common.randn(shape[-1:], dtype, seed=seed + 1))

        common.defence_run(lambda x, w: cutile_impl()(x, w, 1e-6), make, reference64, shape, dtype,
                           mutate=common.mutate_rows)
