"""Softmax: correctness against PyTorch over several shapes and dtypes, then perf records."""
from __future__ import annotations

import pytest

from .. import common
from ..common import torch

pytestmark = common.requires_cuda


def reference(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def reference64(x):
    return torch.softmax(x.double(), dim=-1)


def cutile_impl():
    from tilesuite.ops.cutile.softmax import softmax

    return softmax


CASES = [
    ((1, 10), torch.float32),  # one short row, mostly padding
    ((64, 1000), torch.float16),
    ((128, 4096), torch.bfloat16),
    ((3, 4, 2500), torch.float16),  # 3-D input, tail past two full tiles
    ((33, 32768), torch.float32),  # long rows: many loop steps
    ((512, 151), torch.bfloat16),
]
PERF_CASES = [((32768, 4096), torch.float16), ((4096, 32768), torch.bfloat16)]


class Test_Softmax:
    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(CASES))
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_op(self, shape, dtype, backend):
        # A large shift checks that the maximum is subtracted before exp (no overflow).
        x = common.randn(shape, dtype, seed=1, scale=4.0, shift=30.0)
        common.assert_close(cutile_impl()(x), reference(x), dtype)

    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(PERF_CASES))
    @pytest.mark.parametrize("framework", common.PERF_FRAMEWORKS)
    def test_perf(self, shape, dtype, framework, record_property):
        x = common.randn(shape, dtype, seed=2)
        if framework == "cutile":
            impl = cutile_impl()
            common.assert_close(impl(x), reference(x), dtype)
            fn = lambda: impl(x)  # noqa: E731
            # Timed calls are checked too: first and last, on fresh inputs (bench.OutputCheck).
            checked = dict(inputs=(x,), reference=lambda: reference(x), dtype=dtype)
        else:
            checked = {}
            fn = lambda: torch.softmax(x, dim=-1)  # noqa: E731
        common.record_benchmark(record_property, framework, fn, **checked)

    # A few correctness shapes plus every perf shape: a kernel that special-cases the benchmark is caught there.
    @pytest.mark.defence
    @pytest.mark.parametrize("shape, dtype", common.shape_dtype_params(CASES[1:4] + PERF_CASES))
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_defence(self, shape, dtype, backend):
        common.defence_run(cutile_impl(), lambda seed: (common.randn(shape, dtype, seed=seed, scale=2.0),),
                           reference64, shape, dtype, mutate=common.mutate_rows)
