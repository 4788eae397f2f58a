"""How often a command's walk climbs back up the layers (issue 40: ``try`` at most 10 times,
``status`` and ``verify`` at most 5).

Imports only run down the layers (``test_architecture.py``), but a call can still climb back: a
lower layer calling a function a higher one handed it (the child pool calling the loop's stage
launcher). Each such edge, a (caller, callee) pair of functions with the caller on a lower layer, is
a place where a reader of the lower module must know the higher one. Counted here over real
commands on the SIMULATED TileGym-shaped repository (children run on the CPU), through a profile
hook that sees every Python call in this process and its threads.
"""
from __future__ import annotations

import sys
import threading

from fixtures_repo import allow_no_gpu, edit_kernel, tilegym_like_repo  # noqa: F401
from redteam_helpers import call, start_session
from test_architecture import LAYERS

MOST = {"try": 10, "status": 5, "verify": 5}


def _layer(frame) -> tuple[int | None, str]:
    name = frame.f_globals.get("__name__", "")
    parts = name.split(".")
    if parts[0] != "cutile_perf":
        return None, name
    return LAYERS.get(parts[1] if len(parts) > 1 else "cutile_perf"), name


def climbs(run) -> set[tuple[str, str]]:
    """The (caller, callee) function pairs where a call went from a lower layer to a higher one while
    ``run()`` ran."""
    found: set[tuple[str, str]] = set()

    def hook(frame, event, _arg):
        if event != "call" or frame.f_back is None:
            return
        callee, callee_name = _layer(frame)
        caller, caller_name = _layer(frame.f_back)
        if callee is not None and caller is not None and caller < callee:
            found.add((f"{caller_name}.{frame.f_back.f_code.co_name}", f"{callee_name}.{frame.f_code.co_name}"))

    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return found


def test_try_status_and_verify_climb_back_up_the_layers_only_a_few_times(tilegym_like_repo):
    repo = tilegym_like_repo
    start_session(repo)
    edit_kernel(repo, latency={"256x1024": 0.5, "4096x1024": 1.0})  # kept after its re-check: the longest walk
    walks = {}
    for command, args in (("try", ["faster"]), ("status", []), ("verify", ["--pairs", "3"])):
        result = {}
        walks[command] = climbs(lambda: result.update(zip(("code", "data"), call(repo, command, *args)[:2])))
        assert result["code"] == 0, (command, result["data"])
    assert walks["try"], "the hook saw no climb at all: it is not looking"  # the pool calls the loop's launcher
    for command, most in MOST.items():
        assert len(walks[command]) <= most, (command, sorted(walks[command]))
