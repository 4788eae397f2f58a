"""RMSNorm over the last dimension: ``y = x / sqrt(mean(x**2) + eps) * weight``.

Step 01 (one change from the plain kernel): when the row fits in one tile
(``next_power_of_2(N) <= MAX_ROW_TILE``), each CTA gathers its whole row ONCE as a
``next_power_of_2(N)`` tile, keeps it in registers and writes the result: ``x`` is read once
instead of twice (3N -> 2N elements of traffic per row). Longer rows keep the plain two-pass loop.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream, next_power_of_2

LOOP_TILE_N = 256  # columns per loop step for rows longer than MAX_ROW_TILE
MAX_ROW_TILE = 8192  # a larger row tile would not fit in registers without spilling


@ct.kernel
def rms_norm_row_kernel(x, weight, out, eps: float, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    n = x.shape[1]
    cols = ct.arange(TILE_N, dtype=ct.int32)
    xr = ct.astype(ct.gather(x, (row, cols), padding_value=0), ct.float32)
    w = ct.astype(ct.gather(weight, (cols,), padding_value=0), ct.float32)
    rstd = ct.rsqrt(ct.sum(xr * xr) / n + eps)
    ct.scatter(out, (row, cols), ct.astype(xr * rstd * w, out.dtype))


@ct.kernel
def rms_norm_loop_kernel(x, weight, out, eps: float, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    n = x.shape[1]
    num_col_tiles = ct.cdiv(n, TILE_N)
    cols = ct.arange(TILE_N, dtype=ct.int32)
    sum_sq = ct.full((TILE_N,), 0.0, dtype=ct.float32)
    for j in range(num_col_tiles):
        xj = ct.astype(ct.gather(x, (row, cols + j * TILE_N), padding_value=0), ct.float32)
        sum_sq = sum_sq + xj * xj
    rstd = ct.rsqrt(ct.sum(sum_sq) / n + eps)
    for j in range(num_col_tiles):
        offsets = cols + j * TILE_N
        xj = ct.astype(ct.gather(x, (row, offsets), padding_value=0), ct.float32)
        wj = ct.astype(ct.gather(weight, (offsets,), padding_value=0), ct.float32)
        ct.scatter(out, (row, offsets), ct.astype(xj * rstd * wj, out.dtype))


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
    ct.launch(stream, (rows.shape[0],), rms_norm_row_kernel, (rows, w, out, float(eps), row_tile))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, scalar, signature

    params = [contiguous(ct.float16, 2), contiguous(ct.float16, 1), contiguous(ct.float16, 2), scalar(ct.float32)]
    return [(rms_norm_row_kernel, [signature(params + [1024])]),
            (rms_norm_loop_kernel, [signature(params + [LOOP_TILE_N])])]
