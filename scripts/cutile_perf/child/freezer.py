"""A child's whole process tree, stopped and read from outside: what a child that collected ahead of
its turn may hold beside a timed run.

A child that has run code of the repository (collection imports the tests and the kernel) may not
do anything while another run is timed. It says nothing it could lie about: the harness stops every
process of its tree (``SIGSTOP`` cannot be caught, blocked or ignored, and a process that left its
group with ``setsid`` is still a descendant), then reads in ``/proc`` whether any of them maps a GPU
device file. GPU work is queued through memory the driver maps from ``/dev/nvidia<N>`` and
``/dev/nvidia-uvm`` into every process that holds a CUDA context; a process without such a mapping
has no context, so nothing of it can run on the GPU while it is stopped. One that does is ended:
the run it was started for starts fresh in its turn.
"""
from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

PROC = Path("/proc")
# The device files a CUDA context maps. Not /dev/nvidiactl: ``cuInit`` alone opens it (the CPU-only
# profiler session a waiting child runs initializes the driver and makes no context).
GPU_FILES = ("/dev/nvidia-uvm",)
GPU_FILE_PREFIX = "/dev/nvidia"


def _parent(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 else None


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


def stop_trees(roots: list[int]) -> dict[int, set[int]]:
    """Stop every process of each root's tree; returns ``{root: its processes}``. A stopped process
    forks nothing, so ``/proc`` is read again until a pass finds no process not stopped yet (one
    pass serves every tree: each costs a read of every process's ``stat``)."""
    stopped: dict[int, set[int]] = {root: set() for root in roots}
    while True:
        children = _children()
        new = {root: process_tree(root, children) - stopped[root] for root in roots}
        if not any(new.values()):
            return stopped
        for root, pids in new.items():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            stopped[root] |= pids


def stop_tree(root: int) -> set[int]:
    """Stop every process of ``root``'s tree; returns them (``stop_trees``)."""
    return stop_trees([root])[root]


def continue_tree(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)


def is_gpu_file(path: str) -> bool:
    """A device file a CUDA context maps: ``/dev/nvidia<N>`` or ``/dev/nvidia-uvm``."""
    if path in GPU_FILES:
        return True
    rest = path[len(GPU_FILE_PREFIX):] if path.startswith(GPU_FILE_PREFIX) else ""
    return rest.isdigit()


def gpu_files(pid: int) -> list[str]:
    """The GPU device files process ``pid`` maps (``/proc/<pid>/maps``), sorted; [] when it has
    ended. A mapping is read from the kernel's record of the process, which it cannot change."""
    try:
        maps = (PROC / str(pid) / "maps").read_text()
    except OSError:
        return []
    return sorted({p for p in (line.rpartition(" ")[2].strip() for line in maps.splitlines()) if is_gpu_file(p)})


def gpu_holders(pids: set[int]) -> dict[int, list[str]]:
    """``{pid: device files}`` for every process of ``pids`` that maps a GPU device file."""
    return {pid: files for pid in sorted(pids) if (files := gpu_files(pid))}
