"""RMSNorm over the last dimension: ``y = x / sqrt(mean(x**2) + eps) * weight``.

Plain version: one CTA per row, a loop over column tiles with pointer-based ``ct.gather`` /
``ct.scatter``, and two passes over the row (sum of squares, then normalize). It is correct for any
row length and accumulates in fp32, but it reads ``x`` twice and never uses TMA. The prepared
optimizations in ``optimizations/rms_norm/`` improve it one step at a time.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream

TILE_N = 256  # columns per loop step


@ct.kernel
def rms_norm_kernel(x, weight, out, eps: float, TILE_N: ct.Constant[int]):
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
    ct.launch(current_stream(), (rows.shape[0],), rms_norm_kernel,
              (rows, weight.contiguous(), out, float(eps), TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, scalar, signature

    return [(rms_norm_kernel, [signature([contiguous(ct.float16, 2), contiguous(ct.float16, 1),
                                          contiguous(ct.float16, 2), scalar(ct.float32), TILE_N])])]
