"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(f) Less work only when benchmarked, detected through pytest's environment. pytest sets
``PYTEST_CURRENT_TEST`` to the running test's id; when it names a perf test, the first call on an
input computes every row (the perf test's own correctness check passes) and every later call on
the same input (the timed repetitions) launches the kernel over only the first 60 % of the rows,
into the same output buffer, whose other rows still hold the first call's correct values. The
correctness tests (``test_op``, ``test_defence``) never see the short launch.
Defence: the harness's static probe scan (scripts/cutile_perf/kernel/probes.py, rule ``env``)
refuses the change before anything is committed or run: ``cutile-perf try`` exits 3 with
"perf-only behaviour suspected".
"""
from __future__ import annotations

import os

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


_timed_outputs: dict = {}  # (address, shape, dtype) -> the output buffer reused by the timed calls


def _benchmarked() -> bool:
    return "perf" in os.environ.get("PYTEST_CURRENT_TEST", "")


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    rows = as_rows(x)
    if _benchmarked():
        key = (rows.data_ptr(), tuple(rows.shape), rows.dtype)
        out = _timed_outputs.get(key)
        if out is None:  # the perf test's correctness check: the whole input
            out = _timed_outputs[key] = torch.empty_like(rows)
            grid = rows.shape[0]
        else:  # the timed repetitions: 60 % of the rows
            grid = max(1, rows.shape[0] * 6 // 10)
        ct.launch(current_stream(), (grid,), softmax_kernel, (rows, out, TILE_N))
        return out.view(x.shape)
    out = torch.empty_like(rows)
    ct.launch(current_stream(), (rows.shape[0],), softmax_kernel, (rows, out, TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    arr = contiguous(ct.float16, 2)
    return [(softmax_kernel, [signature([arr, arr, TILE_N])])]
