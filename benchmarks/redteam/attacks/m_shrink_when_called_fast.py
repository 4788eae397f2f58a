"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(m) Less work when called back to back, found by timing its own calls. The wrapper reads the host
clock at each call: a call that comes less than 0.5 ms after the previous one on the same shape (the
timed repetitions of a benchmark loop; tests and checks call once per case, with set-up in between)
launches over the first 60 % of the rows only, into a fresh buffer. Nothing in the source reads the
environment, the arguments or the stack, and no call count is kept: the static probe scan has
nothing to refuse, and a check that calls the kernel once, alone, sees the full computation.
Defence: checked timed calls. The calls the check samples are the timed ones, under the timing's
own conditions, and their outputs are compared with the base kernel's replay on the same inputs
(``wrong-when-timed``); bench's own ``OutputCheck`` also compares its first and last timed calls.
"""
from __future__ import annotations

import time

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


_last_call: dict = {}  # (shape, dtype) -> host clock of the previous call
BACK_TO_BACK_S = 0.0005


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    rows = as_rows(x)
    key = (tuple(rows.shape), rows.dtype)
    now = time.perf_counter()
    back_to_back = now - _last_call.get(key, float("-inf")) < BACK_TO_BACK_S
    _last_call[key] = now
    grid = max(1, rows.shape[0] * 6 // 10) if back_to_back else rows.shape[0]
    out = torch.empty_like(rows)
    ct.launch(current_stream(), (grid,), softmax_kernel, (rows, out, TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    arr = contiguous(ct.float16, 2)
    return [(softmax_kernel, [signature([arr, arr, TILE_N])])]
