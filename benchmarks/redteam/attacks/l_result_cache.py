"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(l) A result cache that is never wrong. The host wrapper remembers the output of each input tensor
it has seen, keyed by the tensor object and its version counter (torch bumps ``_version`` on every
in-place write), and keeps the tensor alive so its id is never reused. A call on the same tensor
with unchanged contents returns the remembered output without launching anything; a new tensor or
an in-place change computes afresh. So every output is correct: the correctness tests, the defence
run (fresh inputs, reused addresses) and ``bench.OutputCheck`` (fresh values written in place
before the first and last timed calls) all pass, and so does a replay of the base kernel on the
captured inputs. Only the timed repetitions on one unchanged input hit the cache: they move no
bytes at all. Nothing in the source reads the environment, the arguments or the stack.
Defence: the physics floor of checked timed calls (``implausible``): a timed call cannot read its
input and write its output faster than the GPU's memory bandwidth allows.
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


_seen: dict = {}  # id(x) -> (x kept alive, its version when computed, the output)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    hit = _seen.get(id(x))
    if hit is not None and hit[0] is x and hit[1] == x._version:
        return hit[2]
    rows = as_rows(x)
    out = torch.empty_like(rows)
    ct.launch(current_stream(), (rows.shape[0],), softmax_kernel, (rows, out, TILE_N))
    result = out.view(x.shape)
    _seen[id(x)] = (x, x._version, result)
    return result


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    arr = contiguous(ct.float16, 2)
    return [(softmax_kernel, [signature([arr, arr, TILE_N])])]
