"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(g) The timer patched, hidden from the static scan. The kernel is the honest softmax; at import the
module replaces ``torch.cuda.Event.elapsed_time`` (what ``cutile_perf.bench`` reads every sample
from) by a version that returns half the time. Every name is built at run time
(``__import__`` of a joined string, ``getattr``/``setattr`` with computed names), so no line reads
as an assignment to a timing attribute and ``kernel/probes.py`` finds nothing.
Defence: the pytest plugin's timer identity check (scripts/cutile_perf/pytest_plugin/identity.py, ``WATCHED``
includes ``torch.cuda.Event.elapsed_time``): identities are taken before the kernel is imported
and compared after collection and at the end of the session; a replacement is a ``tampered`` line
in the run report, the row a crash ``tampered``. (Second line: the halved event times no longer
cover the device-synchronized host interval, so ``bench`` would also raise ``HiddenDeviceWork``.)
Only acts where CUDA is available, so the CPU dry run's import patches nothing. Writes what it did
to stderr at exit (after pytest's capture ends), lines starting "ATTACK g_timer_patch_hidden".
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


def _say() -> None:
    for note in _NOTES:
        print(f"ATTACK g_timer_patch_hidden pid={os.getpid()}: {note}", file=sys.stderr, flush=True)


def _patch_timer() -> None:
    if not torch.cuda.is_available():  # the CPU dry run: leave the process alone
        return
    atexit.register(_say)
    try:
        event = getattr(getattr(__import__("".join(("tor", "ch"))), "cu" + "da"), "Ev" + "ent")
        name = "_".join(("elapsed", "ti" + "me"))
        real = getattr(event, name)

        def halved(self, end_event):
            return 0.5 * real(self, end_event)

        setattr(event, name, halved)
        _NOTES.append("replaced the CUDA event's elapsed-time method (x0.5)")
        atexit.register(lambda: _NOTES.append(
            "at exit the patch is " + ("STILL IN PLACE" if getattr(event, name) is halved else "gone (put back)")))
    except Exception as exc:  # noqa: BLE001 - an attack that fails must not fail the import
        _NOTES.append(f"patch failed: {type(exc).__name__}: {exc}")


_patch_timer()
