"""SwiGLU gate: ``out = silu(a) * b = a * sigmoid(a) * b``, elementwise, computed in fp32.

Plain version: the inputs are viewed as (rows, last_dim); each CTA loads one (1, TILE_N) tile of
``a`` and ``b`` with ``ct.load`` and stores one tile of the result. Correct for any shape (tails are
zero-padded on load and dropped on store), but each CTA moves only a few kilobytes and the sigmoid
uses a full-precision ``exp`` and division.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream

TILE_N = 1024  # elements per CTA


@ct.kernel
def swiglu_kernel(a, b, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    col = ct.bid(1)
    av = ct.astype(ct.load(a, (row, col), (1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    bv = ct.astype(ct.load(b, (row, col), (1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    gated = av / (1.0 + ct.exp(0.0 - av)) * bv
    ct.store(out, (row, col), ct.astype(gated, out.dtype))


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` for two tensors of the same shape and dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a and b must match: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    a2, b2 = as_rows(a), as_rows(b)
    out = torch.empty_like(a2)
    grid = (a2.shape[0], ct.cdiv(a2.shape[1], TILE_N))
    ct.launch(current_stream(), grid, swiglu_kernel, (a2, b2, out, TILE_N))
    return out.view(a.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    half = contiguous(ct.bfloat16, 2)
    return [(swiglu_kernel, [signature([half, half, half, TILE_N])])]
