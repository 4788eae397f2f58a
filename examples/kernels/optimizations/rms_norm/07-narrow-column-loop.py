"""RMSNorm over the last dimension: ``y = x / sqrt(mean(x**2) + eps) * weight``.

Step 07 (expected SLOWER on H200; kept in the suite to show a real revert): back to one row per CTA,
walking the row in narrow (1, 64) column tiles over two passes, with an occupancy hint of 16. The
idea an agent might have: small tiles need few registers, so many CTAs fit per SM and hide latency.
Why it loses: a memory-bound kernel needs about bandwidth x latency bytes in flight (H200: ~4.8 TB/s
x ~1 us, ~36 KB per SM). A 64-wide fp16 tile is 128 bytes, each loop step waits for its load before
the reduction, and the second pass re-reads x, so even 16 resident CTAs keep only a few KB in flight.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream

TILE_N = 64  # columns per loop step
OCCUPANCY = 16
ZERO = ct.PaddingMode.ZERO


@ct.kernel(occupancy=OCCUPANCY)
def rms_norm_kernel(x, weight, out, eps: float, TILE_N: ct.Constant[int]):
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
    ct.launch(current_stream(), (rows.shape[0],), rms_norm_kernel,
              (rows, weight.contiguous(), out, float(eps), TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, scalar, signature

    return [(rms_norm_kernel, [signature([contiguous(ct.float16, 2), contiguous(ct.float16, 1),
                                          contiguous(ct.float16, 2), scalar(ct.float32), TILE_N])])]
