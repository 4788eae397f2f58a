"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(e) Less work only for the benchmark shapes. For exactly the perf tests' shapes, the first pass
reads one tile of each row instead of the whole row and extrapolates the sum (about half the
memory traffic; ~2-4 % error, far inside the ordinary tolerances at those shapes); every other
shape gets the exact kernel, so the correctness tests see nothing.
Defence: the defence run checks correctness at the perf shapes too, against float64, ulp by ulp.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream

TILE_N = 1024  # columns per loop step


@ct.kernel
def softmax_kernel(x, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    num_col_tiles = ct.num_tiles(x, axis=1, shape=(1, TILE_N))
    run_max = ct.full((1, 1), float("-inf"), dtype=ct.float32)
    run_sum = ct.full((1, 1), 0.0, dtype=ct.float32)
    for j in range(num_col_tiles):
        t = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF), ct.float32)
        new_max = ct.maximum(run_max, ct.max(t, axis=1, keepdims=True))
        run_sum = run_sum * ct.exp(run_max - new_max) + ct.sum(ct.exp(t - new_max), axis=1, keepdims=True)
        run_max = new_max
    for j in range(num_col_tiles):
        t = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF), ct.float32)
        ct.store(out, (row, j), ct.astype(ct.exp(t - run_max) / run_sum, out.dtype))


@ct.kernel
def softmax_estimated_kernel(x, out, row_scale: float, TILE_N: ct.Constant[int]):
    """Statistics from the first tile only; the row sum extrapolated to the row length."""
    row = ct.bid(0)
    num_col_tiles = ct.num_tiles(x, axis=1, shape=(1, TILE_N))
    t0 = ct.astype(ct.load(x, (row, 0), (1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF), ct.float32)
    run_max = ct.max(t0, axis=1, keepdims=True)
    run_sum = ct.sum(ct.exp(t0 - run_max), axis=1, keepdims=True) * row_scale
    for j in range(num_col_tiles):
        t = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF), ct.float32)
        ct.store(out, (row, j), ct.astype(ct.exp(t - run_max) / run_sum, out.dtype))


BENCHMARK_SHAPES = {(32768, 4096), (4096, 32768)}


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    rows = as_rows(x)
    out = torch.empty_like(rows)
    if tuple(rows.shape) in BENCHMARK_SHAPES:
        ct.launch(current_stream(), (rows.shape[0],), softmax_estimated_kernel,
                  (rows, out, rows.shape[1] / TILE_N, TILE_N))
    else:
        ct.launch(current_stream(), (rows.shape[0],), softmax_kernel, (rows, out, TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, scalar, signature

    arr = contiguous(ct.float16, 2)
    return [(softmax_kernel, [signature([arr, arr, TILE_N])]),
            (softmax_estimated_kernel, [signature([arr, arr, scalar(ct.float32), TILE_N])])]
