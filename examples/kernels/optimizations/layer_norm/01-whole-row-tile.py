"""LayerNorm over the last dimension: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

Step 01: rows up to MAX_ROW_TILE columns are loaded ONCE as a (1, next_power_of_2(N)) tile; the mean,
the (masked) variance of ``x - mean`` and the output are all computed from registers. One read of
the row instead of three, with the same two-pass statistics. Longer rows keep the plain loop.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream, next_power_of_2

LOOP_TILE_N = 512  # columns per loop step for rows longer than MAX_ROW_TILE
MAX_ROW_TILE = 8192  # fp32 row in registers; larger rows would spill
ZERO = ct.PaddingMode.ZERO


@ct.kernel
def layer_norm_row_kernel(x, weight, bias, out, eps: float, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    n = x.shape[1]
    cols = ct.reshape(ct.arange(TILE_N, dtype=ct.int32), (1, TILE_N))
    t = ct.astype(ct.load(x, (row, 0), (1, TILE_N), padding_mode=ZERO), ct.float32)
    mean = ct.sum(t) / n
    dev = ct.where(cols < n, t - mean, 0.0)
    rstd = ct.rsqrt(ct.sum(dev * dev) / n + eps)
    w = ct.reshape(ct.astype(ct.load(weight, (0,), (TILE_N,), padding_mode=ZERO), ct.float32), (1, TILE_N))
    b = ct.reshape(ct.astype(ct.load(bias, (0,), (TILE_N,), padding_mode=ZERO), ct.float32), (1, TILE_N))
    ct.store(out, (row, 0), ct.astype(dev * rstd * w + b, out.dtype))


@ct.kernel
def layer_norm_loop_kernel(x, weight, bias, out, eps: float, TILE_N: ct.Constant[int]):
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
    row_tile = next_power_of_2(n)
    if row_tile <= MAX_ROW_TILE:
        kernel, tile = layer_norm_row_kernel, row_tile
    else:
        kernel, tile = layer_norm_loop_kernel, LOOP_TILE_N
    ct.launch(current_stream(), (rows.shape[0],), kernel,
              (rows, weight.contiguous(), bias.contiguous(), out, float(eps), tile))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, scalar, signature

    vec = contiguous(ct.float16, 1)
    params = [contiguous(ct.float16, 2), vec, vec, contiguous(ct.float16, 2), scalar(ct.float32)]
    return [(layer_norm_row_kernel, [signature(params + [1024])]),
            (layer_norm_loop_kernel, [signature(params + [LOOP_TILE_N])])]
