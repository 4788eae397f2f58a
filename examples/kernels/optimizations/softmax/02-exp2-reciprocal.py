"""Softmax over the last dimension, computed in fp32.

Step 02: on top of step 01's single-read row tile, exponentials use ``exp2`` of inputs pre-scaled by
log2(e) with flush-to-zero (one MUFU.EX2, no extra multiply inside exp), and the normalization
multiplies by one reciprocal of the sum per row instead of dividing every element.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream, next_power_of_2

LOOP_TILE_N = 1024  # columns per loop step for rows longer than MAX_ROW_TILE
MAX_ROW_TILE = 8192  # fp32 row in registers; larger rows would spill
NEG_INF = ct.PaddingMode.NEG_INF
LOG2E = 1.4426950408889634


@ct.kernel
def softmax_row_kernel(x, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    t = ct.astype(ct.load(x, (row, 0), (1, TILE_N), padding_mode=NEG_INF), ct.float32) * LOG2E
    e = ct.exp2(t - ct.max(t, axis=1, keepdims=True), flush_to_zero=True)
    inv_sum = 1.0 / ct.sum(e, axis=1, keepdims=True)
    ct.store(out, (row, 0), ct.astype(e * inv_sum, out.dtype))


@ct.kernel
def softmax_loop_kernel(x, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    num_col_tiles = ct.num_tiles(x, axis=1, shape=(1, TILE_N))
    run_max = ct.full((1, 1), float("-inf"), dtype=ct.float32)
    run_sum = ct.full((1, 1), 0.0, dtype=ct.float32)
    for j in range(num_col_tiles):
        t = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=NEG_INF), ct.float32)
        new_max = ct.maximum(run_max, ct.max(t, axis=1, keepdims=True))
        run_sum = run_sum * ct.exp(run_max - new_max) + ct.sum(ct.exp(t - new_max), axis=1, keepdims=True)
        run_max = new_max
    for j in range(num_col_tiles):
        t = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=NEG_INF), ct.float32)
        ct.store(out, (row, j), ct.astype(ct.exp(t - run_max) / run_sum, out.dtype))


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    rows = as_rows(x)
    out = torch.empty_like(rows)
    row_tile = next_power_of_2(rows.shape[1])
    if row_tile <= MAX_ROW_TILE:
        kernel, tile = softmax_row_kernel, row_tile
    else:
        kernel, tile = softmax_loop_kernel, LOOP_TILE_N
    ct.launch(current_stream(), (rows.shape[0],), kernel, (rows, out, tile))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    arr = contiguous(ct.float16, 2)
    return [(softmax_row_kernel, [signature([arr, arr, 4096])]),
            (softmax_loop_kernel, [signature([arr, arr, LOOP_TILE_N])])]
