"""A child's whole process tree, stopped and read from outside: what a child that collected ahead of
its turn may hold beside a timed run.

A child that has run code of the repository (collection imports the tests and the kernel) may not
do anything while another run is timed. It says nothing it could lie about: the harness stops every
process of its tree (``SIGSTOP`` cannot be caught, blocked or ignored, and a process that left its
group with ``setsid`` is still a descendant), then asks whether any of them holds a CUDA context:
the driver's list of compute processes (``nvidia-smi``, NVML) and the kernel's record of each
process's mappings (``/proc/<pid>/maps``: a context maps ``/dev/nvidia-uvm``). A stopped process
without a context has nothing that can run on the GPU. One that holds one is ended: the run it was
started for starts fresh in its turn.

What a GPU showed (``benchmarks/probes/collect_context.py``; ``docs/results/2026-12-02-h200-speed.md``,
section 14): after collecting
TileGym's rms_norm tests (its conftest asks torch for the device's capability) the process had
torch's CUDA initialized and mapped ``/dev/nvidia0`` and ``/dev/nvidiactl``, and nvidia-smi listed
no process; after one tensor on the GPU it also mapped ``/dev/nvidia-uvm`` and nvidia-smi listed it
by the pid it has in its own namespace. So ``/dev/nvidia0`` alone is no sign of a context.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

PROC = Path("/proc")
# The device file a CUDA context maps (unified memory). Not /dev/nvidia<N> nor /dev/nvidiactl: the
# driver's initialization maps those without a context (module docstring).
GPU_FILES = ("/dev/nvidia-uvm",)
NVIDIA_SMI_TIMEOUT_S = 10.0


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None when it has ended: state
    is [0], the parent [1], the group [2], the start time [19]. The name may hold spaces and
    parentheses (and bytes that are no text), so the fields start after the last ")"."""
    return _fields_after_name(PROC / str(pid) / "stat")


def _fields_after_name(stat_file: Path) -> list[str] | None:
    """A ``stat`` file's fields after the command name (a process's or one thread's), or None."""
    try:
        stat = stat_file.read_bytes().decode("ascii", errors="replace")
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def _parent(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def _children() -> dict[int, list[int]]:
    """Every live process's children, from one pass over ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            parent = _parent(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    return children


def process_tree(root: int, children: dict[int, list[int]] | None = None) -> set[int]:
    """``root`` and every live process descended from it (``children``: one ``/proc`` pass to reuse)."""
    children = _children() if children is None else children
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree and (PROC / str(pid)).exists():
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


STOP_SETTLE_S = 2.0  # how long stop_trees waits for every thread it signalled to be stopped


def stop_trees(roots: list[int], settle_s: float = STOP_SETTLE_S) -> dict[int, set[int]]:
    """Stop every process of each root's tree; returns ``{root: its processes}``. A stopped process
    forks nothing, so ``/proc`` is read again until a pass finds no process not stopped yet (one
    pass serves every tree: each costs a read of every process's ``stat``). SIGSTOP takes effect
    when each thread next enters the kernel, not when ``kill`` returns: on a loaded machine a
    thread could still run for a moment, beside a run about to be timed. So it returns once every
    thread of those processes is stopped or gone (``settle_s`` at most)."""
    stopped: dict[int, set[int]] = {root: set() for root in roots}
    while True:
        children = _children()
        new = {root: process_tree(root, children) - stopped[root] for root in roots}
        if not any(new.values()):
            wait_stopped(set().union(*stopped.values()), settle_s)
            return stopped
        for root, pids in new.items():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            stopped[root] |= pids


def thread_states(pid: int) -> list[str]:
    """The state letter of every thread of ``pid`` ([] when it has ended)."""
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return []
    return [fields[0] for fields in (_fields_after_name(task / "stat") for task in tasks) if fields]


def wait_stopped(pids: set[int], timeout_s: float, poll_s: float = 0.002) -> bool:
    """Wait until every thread of ``pids`` is stopped (``T``, ``t``) or gone (``Z``, ``X``, no entry)."""
    end = time.monotonic() + timeout_s
    while True:
        running = {pid for pid in pids if any(s not in "TtZX" for s in thread_states(pid))}
        if not running:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(poll_s)


def stop_tree(root: int) -> set[int]:
    """Stop every process of ``root``'s tree; returns them (``stop_trees``)."""
    return stop_trees([root])[root]


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie has already released its memory and files (a CUDA
    context goes with them), so it counts as gone."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def wait_gone(pids: set[int], timeout_s: float, poll_s: float = 0.02) -> bool:
    """Wait until none of ``pids`` runs and the driver lists none of them (``compute_pids``): a
    process that held a CUDA context is killed asynchronously (its box's init dies after the
    group's leader), and its context, with any work it queued, ends only when it has exited.
    False when that took longer than ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while True:
        running = {pid for pid in pids if _alive(pid)}
        listed = compute_pids() if not running else None
        if not running and not (listed and listed & pids):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(poll_s)


def continue_tree(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)


def is_gpu_file(path: str) -> bool:
    """A device file a CUDA context maps (``GPU_FILES``)."""
    return path in GPU_FILES


def mapped_paths(maps: str) -> list[str]:
    """The file of every line of a ``/proc/<pid>/maps`` text that names one, in order. A line is
    five fields and then the path, which may itself hold spaces (a folder name, or the kernel's
    " (deleted)" after a file removed since), so it is split five times, not at its last space."""
    paths = []
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6:
            paths.append(fields[5].strip())
    return paths


def gpu_files(pid: int) -> list[str]:
    """The GPU device files process ``pid`` maps (``/proc/<pid>/maps``), sorted; [] when it has
    ended. A mapping is read from the kernel's record of the process, which it cannot change."""
    try:
        maps = (PROC / str(pid) / "maps").read_text()
    except OSError:
        return []
    return sorted({path for path in mapped_paths(maps) if is_gpu_file(path)})


def compute_pids() -> set[int] | None:
    """The processes the driver lists with a CUDA context on any GPU (``nvidia-smi``, by the pid
    this process sees them under), or None when it cannot be asked (no nvidia-smi, or it failed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return parse_compute_pids(done.stdout)


def parse_compute_pids(text: str) -> set[int]:
    """The pids of ``nvidia-smi --query-compute-apps=pid --format=csv,noheader``'s output."""
    return {int(line.strip()) for line in text.splitlines() if line.strip().isdigit()}


def gpu_holders(pids: set[int], listed: set[int] | None = None) -> dict[int, list[str]]:
    """``{pid: why}`` for every process of ``pids`` that holds a CUDA context: the GPU device files
    it maps, and "a CUDA context (nvidia-smi)" when the driver lists it (``listed``: that list,
    ``compute_pids``; None when it could not be asked)."""
    held = {}
    for pid in sorted(pids):
        why = [f"{f} mapped" for f in gpu_files(pid)] + (["a CUDA context (nvidia-smi)"] if listed and pid in listed
                                                         else [])
        if why:
            held[pid] = why
    return held
