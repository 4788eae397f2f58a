"""RMSNorm over the last dimension: ``y = x / sqrt(mean(x**2) + eps) * weight``.

Step 04 (one change from step 03): ``ct.load``/``ct.store`` of (TILE_M, next_power_of_2(N)) tiles by
tile index instead of ``ct.gather``/``ct.scatter`` with element offsets (the long-row loop likewise,
in (1, 256) tiles). On sm_90 the row-block load becomes TMA bulk copies (UTMALDG.2D into shared
memory, no per-element address or bounds math) and so does the store (UTMASTG.2D); zero padding
keeps the sum of squares right for rows that are not a power of two.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream, next_power_of_2

LOOP_TILE_N = 256  # columns per loop step for rows longer than MAX_ROW_TILE
MAX_ROW_TILE = 8192  # a larger row tile would not fit in registers without spilling
ROWS_TILE_ELEMS = 8192  # rows per CTA = ROWS_TILE_ELEMS // row tile: ~16 KB of 16-bit data per CTA
OCCUPANCY = 4  # CTAs per SM the compiler sizes registers for
ZERO = ct.PaddingMode.ZERO


@ct.kernel(occupancy=OCCUPANCY)
def rms_norm_rows_kernel(x, weight, out, eps: float, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]):
    n = x.shape[1]
    block = ct.bid(0)
    xr = ct.astype(ct.load(x, (block, 0), (TILE_M, TILE_N), padding_mode=ZERO), ct.float32)
    w = ct.reshape(ct.astype(ct.load(weight, (0,), (TILE_N,), padding_mode=ZERO), ct.float32), (1, TILE_N))
    rstd = ct.rsqrt(ct.sum(xr * xr, axis=1, keepdims=True) / n + eps)
    ct.store(out, (block, 0), ct.astype(xr * rstd * w, out.dtype))


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
    stream, w = current_stream(), weight.contiguous()
    row_tile = next_power_of_2(rows.shape[1])
    if row_tile > MAX_ROW_TILE:
        ct.launch(stream, (rows.shape[0],), rms_norm_loop_kernel, (rows, w, out, float(eps), LOOP_TILE_N))
        return out.view(x.shape)
    tile_m = max(1, ROWS_TILE_ELEMS // row_tile)
    grid = (ct.cdiv(rows.shape[0], tile_m),)
    ct.launch(stream, grid, rms_norm_rows_kernel, (rows, w, out, float(eps), tile_m, row_tile))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, scalar, signature

    params = [contiguous(ct.float16, 2), contiguous(ct.float16, 1), contiguous(ct.float16, 2), scalar(ct.float32)]
    return [(rms_norm_rows_kernel, [signature(params + [8, 1024]), signature(params + [2, 4096])]),
            (rms_norm_loop_kernel, [signature(params + [LOOP_TILE_N])])]
