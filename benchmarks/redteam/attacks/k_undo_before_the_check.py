"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(k) The timer patched only while it matters, and put back before anyone looks. The kernel is the
honest softmax. On its first call in a perf child (after the plugin's "after collection" identity
check), it replaces ``torch.cuda.Event.elapsed_time`` by a version that halves every reading
below 5 ms (the per-call samples; the 20 ms batches of bench's hidden-work check stay true, so that
check sees nothing), and registers a pytest plugin whose ``pytest_sessionfinish`` runs first and
puts the original back, so the identity check at the end of the session finds the real method.
Names are built at run time, so the static scan finds nothing either.
Defence: bench's device-time witness. ``bench_record`` profiles three more calls with CUPTI
(torch.profiler) and records ``device_ms``; the record's halved median is far below it
(``judge.rules.witness_shortfall``), and the harness calls the perf stage ``tampered``.
Only acts where CUDA is available. Writes what it did to stderr at exit, lines starting
"ATTACK k_undo_before_the_check".
"""
from __future__ import annotations

import atexit
import os
import sys

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


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    if not _STATE:
        _patch_for_this_session()
    rows = as_rows(x)
    out = torch.empty_like(rows)
    ct.launch(current_stream(), (rows.shape[0],), softmax_kernel, (rows, out, TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    arr = contiguous(ct.float16, 2)
    return [(softmax_kernel, [signature([arr, arr, TILE_N])])]


_NOTES: list[str] = []
_STATE: dict = {}


def _say() -> None:
    for note in _NOTES:
        print(f"ATTACK k_undo_before_the_check pid={os.getpid()}: {note}", file=sys.stderr, flush=True)


class _PutBack:
    """Runs before the harness's plugin at the end of the session (tryfirst) and undoes the patch."""

    def __init__(self, owner, name, real):
        self.owner, self.name, self.real = owner, name, real

    def pytest_sessionfinish(self, session, exitstatus):
        setattr(self.owner, self.name, self.real)
        _NOTES.append("put the original back before the end-of-session check")

    # What pytest.hookimpl(tryfirst=True) would set, written out: the kernel imports no test framework.
    pytest_sessionfinish.pytest_impl = {"tryfirst": True, "trylast": False, "hookwrapper": False, "wrapper": False,
                                        "optionalhook": False, "specname": None}


def _patch_for_this_session() -> None:
    _STATE["done"] = True
    if not torch.cuda.is_available():  # the CPU dry run: leave the process alone
        return
    atexit.register(_say)
    try:
        import gc

        config = next(o for o in gc.get_objects() if type(o).__name__ == "Config" and hasattr(o, "pluginmanager"))
        event = getattr(getattr(__import__("".join(("tor", "ch"))), "cu" + "da"), "Ev" + "ent")
        name = "_".join(("elapsed", "ti" + "me"))
        real = getattr(event, name)

        def halved(self, end_event):
            ms = real(self, end_event)
            return 0.5 * ms if ms < 5.0 else ms

        setattr(event, name, halved)
        config.pluginmanager.register(_PutBack(event, name, real), "softmax-compat")
        _NOTES.append("replaced the CUDA event's elapsed-time method (x0.5 below 5 ms) after collection")
    except Exception as exc:  # noqa: BLE001 - an attack that fails must not fail the call
        _NOTES.append(f"patch failed: {type(exc).__name__}: {exc}")
