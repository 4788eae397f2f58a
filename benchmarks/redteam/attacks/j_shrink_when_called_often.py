"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(j) Less work when called often, with no probe at all. The kernel counts the calls on each input
buffer (address, shape, dtype): the first 6 compute every row, so the correctness tests (one call
per case) and the defence run (three calls per case) pass, and so does the perf test's own
correctness check; from the 7th call on the same buffer (the timed repetitions) it launches over
the first 60 % of the rows, into the output buffer of the earlier calls. Nothing in the source
reads the environment, the arguments or the stack: the static probe scan has nothing to refuse.
Defence: the checked perf stage. The bundled perf tests pass ``reference`` and ``inputs`` to
``record_benchmark``, so ``cutile_perf.bench`` runs the first and last timed calls on fresh input
values (permuted in place: same buffer, same count) and compares them with the reference
(``bench.OutputCheck``): the perf test fails with ``WrongWhenTimed`` and the row is a crash.
Without the check the timed calls are 40 % shorter and the change reads as faster.
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


_calls: dict = {}  # (address, shape, dtype) -> calls so far
_outputs: dict = {}  # (address, shape, dtype) -> the output buffer the shortened calls reuse
HONEST_CALLS = 6


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    rows = as_rows(x)
    key = (rows.data_ptr(), tuple(rows.shape), rows.dtype)
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] <= HONEST_CALLS:
        out = _outputs[key] = torch.empty_like(rows)
        grid = rows.shape[0]
    else:
        out = _outputs[key]
        grid = max(1, rows.shape[0] * 6 // 10)
    ct.launch(current_stream(), (grid,), softmax_kernel, (rows, out, TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    arr = contiguous(ct.float16, 2)
    return [(softmax_kernel, [signature([arr, arr, TILE_N])])]
