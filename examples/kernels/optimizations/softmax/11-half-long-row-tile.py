"""Softmax over the last dimension, computed in fp32.

Step 11 (one change from step 10): 16-bit rows longer than 8192 columns, up to 32768, get a kernel
of their own, one CTA per row with the whole row in one tile, read ONCE and kept in its 16-bit
form. The max, the sum of exp2 and the output ``exp2(x * log2(e) - (max + log2(sum)))`` are each
recomputed from it, so no fp32 copy of the row has to stay in registers. Until this step every
prepared step sent such rows through the plain two-pass loop (1024-column tiles, exp, a division
per element), which reads each row twice. First written by an agent in the live eval of
2026-12-01 (trial softmax-make-faster skill-2, see the cutile-perf README); its other changes, to
the fp32 loop kernel, are left out here.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream, next_power_of_2

LOOP_TILE_N = 1024  # columns per loop step for rows longer than MAX_ROW_TILE
MAX_ROW_TILE = 8192  # fp32 row in registers; larger rows would spill
ROWS_TILE_ELEMS = 4096  # rows per CTA = ROWS_TILE_ELEMS // row tile: ~16 KB of fp16 per CTA
OCCUPANCY = 4  # CTAs per SM the compiler sizes registers for
MAX_HALF_ROW_TILE = 32768  # 16-bit rows up to this length: the whole row in one tile
LONG_ROW_OCCUPANCY = 2
NEG_INF = ct.PaddingMode.NEG_INF
ZERO = ct.PaddingMode.ZERO
LOG2E = 1.4426950408889634


@ct.kernel(occupancy=OCCUPANCY)
def softmax_rows_kernel(x, out, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]):
    # A bulk (TMA) copy can only fill out-of-bounds elements with zeros, so the tile is loaded
    # zero-padded and the columns past the row end are set to -inf here: they never win the max and
    # exp2 maps them to 0, so the sum is over the true row. Rows past the end of x (last block) load
    # as zeros, stay finite, and are never stored.
    in_row = ct.reshape(ct.arange(TILE_N, dtype=ct.int32), (1, TILE_N)) < x.shape[1]
    block = ct.bid(0)
    t = ct.load(x, (block, 0), (TILE_M, TILE_N), padding_mode=ZERO, latency=10, allow_tma=False)
    t = ct.where(in_row, ct.astype(t, ct.float32) * LOG2E, float("-inf"))
    e = ct.exp2(t - ct.max(t, axis=1, keepdims=True), flush_to_zero=True)
    inv_sum = 1.0 / ct.sum(e, axis=1, keepdims=True)
    ct.store(out, (block, 0), ct.astype(e * inv_sum, out.dtype), latency=3, allow_tma=False)


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


@ct.kernel(occupancy=LONG_ROW_OCCUPANCY)
def softmax_long_row_kernel(x, out, TILE_N: ct.Constant[int]):
    # -inf padding: the columns past the row end never win the max and exp2 maps them to 0.
    row = ct.bid(0)
    raw = ct.load(x, (row, 0), (1, TILE_N), padding_mode=NEG_INF, latency=10, allow_tma=False)
    m = ct.astype(ct.max(raw, axis=1, keepdims=True), ct.float32) * LOG2E
    s = ct.sum(ct.exp2(ct.astype(raw, ct.float32) * LOG2E - m, flush_to_zero=True), axis=1, keepdims=True)
    y = ct.exp2(ct.astype(raw, ct.float32) * LOG2E - (m + ct.log2(s)), flush_to_zero=True)
    ct.store(out, (row, 0), ct.astype(y, out.dtype), latency=3, allow_tma=False)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    rows = as_rows(x)
    out = torch.empty_like(rows)
    stream, row_tile = current_stream(), next_power_of_2(rows.shape[1])
    if row_tile > MAX_ROW_TILE:
        if row_tile <= MAX_HALF_ROW_TILE and rows.element_size() <= 2:
            ct.launch(stream, (rows.shape[0],), softmax_long_row_kernel, (rows, out, row_tile))
            return out.view(x.shape)
        ct.launch(stream, (rows.shape[0],), softmax_loop_kernel, (rows, out, LOOP_TILE_N))
        return out.view(x.shape)
    tile_m = max(1, ROWS_TILE_ELEMS // row_tile)
    grid = (ct.cdiv(rows.shape[0], tile_m),)  # one CTA per row block
    ct.launch(stream, grid, softmax_rows_kernel, (rows, out, tile_m, row_tile))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    arr, bf16 = contiguous(ct.float16, 2), contiguous(ct.bfloat16, 2)
    return [(softmax_rows_kernel, [signature([arr, arr, 2, 4096]), signature([arr, arr, 8, 1024])]),
            (softmax_long_row_kernel, [signature([bf16, bf16, 32768])]),
            (softmax_loop_kernel, [signature([arr, arr, LOOP_TILE_N])])]
