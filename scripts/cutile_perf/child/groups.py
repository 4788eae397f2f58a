"""The one place that ends process groups.

Every child the harness starts leads a process group of its own (``start_new_session``), and what
it starts stays in that group unless it leaves it; in the box (``child/box.py``) even those die with
its PID namespace. So ending a child is ending its group: at its deadline, on an interrupt, after it
exits (a test's daemon must not run into the next iteration), for a spare child nobody asked for,
and for the groups a killed command recorded (``resume``).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

KILL_WAIT_S = 10.0  # how long the leader may take to exit after SIGKILL before we stop waiting for it


def _signal(pgid: int, signum: int) -> bool:
    """Send ``signum`` to group ``pgid``; False when no process of it is left (or none is ours)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None when it has ended: state
    is [0], the parent [1], the group [2], the start time [19]. The name may hold spaces and
    parentheses (and bytes that are no text), so the fields start after the last ")"."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_bytes().decode("ascii", errors="replace")
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def live_members(pgid: int) -> int:
    """How many processes of group ``pgid`` still run (zombies run nothing: a container whose PID 1
    never reaps orphans keeps them forever), from /proc; 0 where there is no /proc to read."""
    count = 0
    for entry in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(int(entry.name))
        if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            count += 1
    return count


def end_group(pgid: int, *, leader: subprocess.Popen | None = None, grace_s: float = 0.0,
              settle_s: float = 0.0) -> bool:
    """End process group ``pgid``: SIGTERM first when ``grace_s`` is given (the ``leader`` may then
    exit on its own within it), then SIGKILL for whatever is left. With ``leader`` the group's
    leader is reaped too; with ``settle_s`` it returns once no member runs any more, or after
    ``settle_s`` (SIGKILL is delivered, not instant). A group already gone is no error: False then,
    True when a process of it was still there to kill."""
    if grace_s > 0 and _signal(pgid, signal.SIGTERM) and leader is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=grace_s)
    existed = _signal(pgid, signal.SIGKILL)
    if leader is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=KILL_WAIT_S)
        # The leader is gone; grandchildren (xdist workers, compile helpers) may linger.
        _signal(pgid, signal.SIGKILL)
    end = time.monotonic() + settle_s
    while settle_s > 0 and live_members(pgid) and time.monotonic() < end:
        time.sleep(0.01)
    return existed
