"""RMSNorm over the last dimension: ``y = x / sqrt(mean(x**2) + eps) * weight``.

Step 02: when the row fits in one tile (``next_power_of_2(N) <= MAX_ROW_TILE``), each CTA loads its
row ONCE as a (1, next_power_of_2(N)) tile, keeps it in registers, and writes the result: one read
of ``x`` instead of two. Longer rows keep step 01's two-pass column loop.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream, next_power_of_2

LOOP_TILE_N = 256  # columns per loop step for rows longer than MAX_ROW_TILE
MAX_ROW_TILE = 8192  # a larger row tile would not fit in registers without spilling
ZERO = ct.PaddingMode.ZERO


@ct.kernel
def rms_norm_row_kernel(x, weight, out, eps: float, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    n = x.shape[1]
    xr = ct.astype(ct.load(x, (row, 0), (1, TILE_N), padding_mode=ZERO), ct.float32)
    w = ct.astype(ct.load(weight, (0,), (TILE_N,), padding_mode=ZERO), ct.float32)
    rstd = ct.rsqrt(ct.sum(xr * xr) / n + eps)
    ct.store(out, (row, 0), ct.astype(xr * rstd * ct.reshape(w, (1, TILE_N)), out.dtype))


@ct.kernel
def rms_norm_loop_kernel(x, weight, out, eps: float, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    n = x.shape[1]
    num_col_tiles = ct.num_tiles(x, axis=1, shape=(1, TILE_N))
    sum_sq = ct.full((1, TILE_N), 0.0, dtype=ct.float32)
    for j in range(num_col_tiles):
        xj = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ZERO), ct.float32)
        sum_sq = sum_sq + xj * xj
    rstd = ct.rsqrt(ct.sum(sum_sq) / n + eps)
    for j in range(num_col_tiles):
        xj = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ZERO), ct.float32)
        wj = ct.astype(ct.load(weight, (j,), (TILE_N,), padding_mode=ZERO), ct.float32)
        ct.store(out, (row, j), ct.astype(xj * rstd * ct.reshape(wj, (1, TILE_N)), out.dtype))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension, scaled by ``weight`` (shape ``(x.shape[-1],)``)."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match last dim {x.shape[-1]}")
    rows = as_rows(x)
    out = torch.empty_like(rows)
    row_tile = next_power_of_2(rows.shape[1])
    if row_tile <= MAX_ROW_TILE:
        kernel, tile = rms_norm_row_kernel, row_tile
    else:
        kernel, tile = rms_norm_loop_kernel, LOOP_TILE_N
    ct.launch(current_stream(), (rows.shape[0],), kernel, (rows, weight.contiguous(), out, float(eps), tile))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, scalar, signature

    params = [contiguous(ct.float16, 2), contiguous(ct.float16, 1), contiguous(ct.float16, 2), scalar(ct.float32)]
    return [(rms_norm_row_kernel, [signature(params + [1024])]),
            (rms_norm_loop_kernel, [signature(params + [LOOP_TILE_N])])]
