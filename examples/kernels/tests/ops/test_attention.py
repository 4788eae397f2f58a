"""FMHA forward: correctness against fp32 SDPA (causal, tails, explicit scale), then perf records."""
from __future__ import annotations

import math

import pytest

from .. import common
from ..common import torch


def reference(q, k, v, causal, scale):
    """SDPA in fp32 (no fp16/bf16 rounding inside), rounded once to the input dtype."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=causal, scale=scale)
    return out.to(q.dtype)


def cutile_impl():
    from tilesuite.ops.cutile.attention import fmha

    return fmha


def make_inputs(shape, dtype, *, seed):
    return tuple(common.randn(shape, dtype, seed=seed + i) for i in range(3))


# ((B, H, S, D), dtype, causal, scale): exact tiles, sequence tails, S = 1, both head dims.
CASES = [
    ((1, 1, 128, 64), torch.float16, False, None),
    ((1, 1, 128, 64), torch.float16, True, None),
    ((2, 3, 100, 64), torch.bfloat16, False, None),  # S below one 128 tile, not a multiple of 64
    ((2, 3, 100, 64), torch.bfloat16, True, None),
    ((1, 2, 257, 128), torch.float16, True, None),  # one row past a tile boundary
    ((1, 2, 257, 128), torch.bfloat16, False, 0.05),  # explicit scale
    ((1, 1, 1, 128), torch.float16, True, None),  # a single token
    ((2, 4, 1000, 128), torch.bfloat16, True, None),
    ((1, 4, 2048, 64), torch.float16, False, None),
    ((1, 4, 2048, 128), torch.float16, True, 0.1),
]
PERF_CASES = [
    ((4, 32, 4096, 128), torch.bfloat16, False),
    ((4, 32, 4096, 128), torch.bfloat16, True),
    ((8, 16, 4096, 64), torch.float16, False),
    ((8, 16, 4096, 64), torch.float16, True),
]


def case_id(shape, dtype, causal, scale=None):
    suffix = "" if scale is None else f"-scale{scale}"
    return f"{common.shape_id(shape)}-{common.dtype_id(dtype)}-{'causal' if causal else 'full'}{suffix}"


def tflops(shape, causal, ms):
    """Throughput of the two GEMMs (QK^T and PV); causal attention does about half the work."""
    b, h, s, d = shape
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12


def sdpa_flash(q, k, v, causal):
    """PyTorch's flash-attention backend, the bar the cuTile kernel is measured against."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


class Test_FMHA_Inputs:
    """Input validation runs on the host, so these run without a GPU."""

    def test_rejects_head_dim_96(self):
        q = torch.empty(1, 1, 8, 96, dtype=torch.float16)
        with pytest.raises(ValueError, match="head dim"):
            cutile_impl()(q, q, q, causal=False)

    def test_rejects_shape_mismatch(self):
        q = torch.empty(1, 1, 8, 64, dtype=torch.float16)
        k = torch.empty(1, 1, 9, 64, dtype=torch.float16)
        with pytest.raises(ValueError, match="equal shape"):
            cutile_impl()(q, k, k, causal=True)

    def test_rejects_fp32(self):
        q = torch.empty(1, 1, 8, 64)
        with pytest.raises(TypeError, match="fp16/bf16"):
            cutile_impl()(q, q, q, causal=False)

    @pytest.mark.parametrize("scale", [0.0, -0.125, float("nan")])
    def test_rejects_non_positive_scale(self, scale):
        q = torch.empty(1, 1, 8, 64, dtype=torch.float16)
        with pytest.raises(ValueError, match="scale must be a positive"):
            cutile_impl()(q, q, q, causal=False, scale=scale)


@common.requires_cuda
class Test_FMHA:
    @pytest.mark.parametrize("shape, dtype, causal, scale",
                             [pytest.param(*c, id=case_id(*c)) for c in CASES])
    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_op(self, shape, dtype, causal, scale, backend):
        q, k, v = make_inputs(shape, dtype, seed=40)
        out = cutile_impl()(q, k, v, causal=causal, scale=scale)
        ref_scale = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        common.assert_close(out, reference(q, k, v, causal, ref_scale), dtype)

    @pytest.mark.parametrize("backend", common.BACKENDS)
    def test_op_large_logits(self, backend):
        """Scores around +-100 before scaling: the running max must keep exp() from overflowing."""
        q, k, v = make_inputs((1, 2, 300, 64), torch.float16, seed=50)
        q = q * 12
        out = cutile_impl()(q, k, v, causal=True, scale=1.0)
        common.assert_close(out, reference(q, k, v, True, 1.0), torch.float16)

    @pytest.mark.parametrize("shape, dtype, causal", [pytest.param(*c, id=case_id(*c)) for c in PERF_CASES])
    @pytest.mark.parametrize("framework", common.PERF_FRAMEWORKS)
    def test_perf(self, shape, dtype, causal, framework, record_property):
        q, k, v = make_inputs(shape, dtype, seed=60)
        if framework == "cutile":
            impl = cutile_impl()
            out = impl(q, k, v, causal=causal)
            common.assert_close(out, reference(q, k, v, causal, 1.0 / math.sqrt(shape[-1])), dtype)
            fn = lambda: impl(q, k, v, causal=causal)  # noqa: E731
            # Timed calls are checked too: first and last, on fresh inputs (bench.OutputCheck).
            checked = dict(inputs=(q, k, v), dtype=dtype,
                           reference=lambda: reference(q, k, v, causal, 1.0 / math.sqrt(shape[-1])))
        else:
            checked = {}
            fn = lambda: sdpa_flash(q, k, v, causal)  # noqa: E731
        record = common.record_benchmark(record_property, framework, fn, **checked)
        record_property("tflops", round(tflops(shape, causal, record[framework]["forward"]["median"]), 1))
