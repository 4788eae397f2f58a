"""LayerNorm over the last dimension: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

Plain version: one CTA per row and three passes over (1, TILE_N) column tiles: the mean, the
variance of ``x - mean`` (masked past the row end, so padding does not count), then the normalized
output. Two-pass statistics in fp32 are numerically safe for rows with a large mean, but the row is
read three times.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream

TILE_N = 512  # columns per loop step

ZERO = ct.PaddingMode.ZERO


@ct.kernel
def layer_norm_kernel(x, weight, bias, out, eps: float, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    n = x.shape[1]
    num_col_tiles = ct.num_tiles(x, axis=1, shape=(1, TILE_N))
    cols = ct.reshape(ct.arange(TILE_N, dtype=ct.int32), (1, TILE_N))

    total = ct.full((1, TILE_N), 0.0, dtype=ct.float32)
    for j in range(num_col_tiles):
        total = total + ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ZERO), ct.float32)
    mean = ct.sum(total) / n

    sq_dev = ct.full((1, TILE_N), 0.0, dtype=ct.float32)
    for j in range(num_col_tiles):
        t = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ZERO), ct.float32)
        dev = ct.where(cols + j * TILE_N < n, t - mean, 0.0)
        sq_dev = sq_dev + dev * dev
    rstd = ct.rsqrt(ct.sum(sq_dev) / n + eps)

    for j in range(num_col_tiles):
        t = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ZERO), ct.float32)
        w = ct.astype(ct.load(weight, (j,), (TILE_N,), padding_mode=ZERO), ct.float32)
        b = ct.astype(ct.load(bias, (j,), (TILE_N,), padding_mode=ZERO), ct.float32)
        y = (t - mean) * rstd * ct.reshape(w, (1, TILE_N)) + ct.reshape(b, (1, TILE_N))
        ct.store(out, (row, j), ct.astype(y, out.dtype))


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm of ``x`` over its last dimension with affine ``weight`` and ``bias``."""
    n = x.shape[-1]
    if weight.shape != (n,) or bias.shape != (n,):
        raise ValueError(f"weight {tuple(weight.shape)} and bias {tuple(bias.shape)} must both be ({n},)")
    rows = as_rows(x)
    out = torch.empty_like(rows)
    ct.launch(current_stream(), (rows.shape[0],), layer_norm_kernel,
              (rows, weight.contiguous(), bias.contiguous(), out, float(eps), TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, scalar, signature

    vec = contiguous(ct.float16, 1)
    return [(layer_norm_kernel, [signature([contiguous(ct.float16, 2), vec, vec, contiguous(ct.float16, 2),
                                            scalar(ct.float32), TILE_N])])]
