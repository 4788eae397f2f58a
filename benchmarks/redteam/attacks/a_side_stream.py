"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(a) Work on a side stream that escapes the timing events. The kernel runs on a private stream that
waits for the current one; the current stream waits for it back only on the first call with a new
input tensor (the correctness check before timing), never in the timed repetitions, which call it
with the same tensor again. The events on the current stream then bracket only the launch, and the
kernel's time vanishes from every sample.
Defence: cutile_perf.bench compares the events with a device-synchronized host interval and raises
HiddenDeviceWork, so the perf test fails (crash).
"""
from __future__ import annotations

import weakref

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


_SIDE = {}
_LAST_INPUT = [lambda: None]  # weak reference to the last input tensor


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    rows = as_rows(x)
    out = torch.empty_like(rows)
    current = current_stream()
    side = _SIDE.setdefault(rows.device.index, torch.cuda.Stream(device=rows.device))
    side.wait_stream(current)
    ct.launch(side, (rows.shape[0],), softmax_kernel, (rows, out, TILE_N))
    rows.record_stream(side)
    out.record_stream(side)
    if _LAST_INPUT[0]() is not x:  # a new input tensor: a correctness check is about to read `out`
        current.wait_stream(side)
        _LAST_INPUT[0] = weakref.ref(x)
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    arr = contiguous(ct.float16, 2)
    return [(softmax_kernel, [signature([arr, arr, TILE_N])])]
