"""The local engine: one worker process per GPU of this node, sharing one task folder.

Each worker is ``python -m cutile_perf.node.worker`` with ``CUDA_VISIBLE_DEVICES`` set to its GPU
alone, so whatever its tasks start sees exactly one GPU. Workers claim tasks by rename
(``node.tasks``), so each task runs on one worker at a time. The driver here only watches: a worker
that exits while the queue still holds work, or that died holding a claim, has its claims released
(re-queued, or recorded lost past ``max_attempts``) and is started again.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.node.gpus import Gpu
from cutile_perf.node.tasks import LOST, TaskDir

PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # this cutile_perf, not another installed one


def worker_env(gpu: Gpu) -> dict[str, str]:
    """A worker's environment: ours, with its one GPU visible and this package importable first."""
    path = [str(PACKAGE_PARENT), knobs.pythonpath()]
    return knobs.child_env(CUDA_VISIBLE_DEVICES=gpu.device, PYTHONPATH=os.pathsep.join(p for p in path if p))


def _start(root: Path, name: str, gpu: Gpu, spec: str) -> subprocess.Popen:
    log = (root / "logs").joinpath(f"{name}.log")
    log.parent.mkdir(exist_ok=True)
    with open(log, "ab") as out:  # the child keeps its own descriptor: output to a file, never an unread pipe
        return subprocess.Popen([sys.executable, "-m", "cutile_perf.node.worker", str(root), name, spec],
                                env=worker_env(gpu), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def run_local(tasks: Mapping[str, dict], spec: str, gpus: Sequence[Gpu], root: Path, *,
              max_attempts: int = 2, poll_s: float = 0.05) -> dict[str, dict]:
    """Run every task (id -> payload) through ``spec`` on one worker per GPU; returns id -> result,
    one for every task (status "ok", "error" or "lost")."""
    folder = TaskDir(root)
    for task_id, payload in tasks.items():
        folder.submit(task_id, payload)
    names = {f"w{i}-gpu{gpu.device or 'cpu'}": gpu for i, gpu in enumerate(gpus)}
    workers = {name: _start(folder.root, name, gpu, spec) for name, gpu in names.items()}
    try:
        while folder.outstanding(tasks):
            # One snapshot of the dead: each has its claims released before anything is judged
            # stranded (a worker that dies after the snapshot is seen on the next turn).
            dead = [name for name, proc in workers.items() if proc.poll() is not None]
            for name in dead:
                folder.release(name, max_attempts)  # re-queued or recorded lost, never dropped
            for name in dead[:folder.waiting()]:
                workers[name] = _start(folder.root, name, names[name], spec)
            if len(dead) == len(workers) and not folder.waiting():
                _record_stranded(folder, tasks)
                break
            time.sleep(poll_s)
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    found = folder.results()
    return {task_id: found[task_id] for task_id in tasks}


def _record_stranded(folder: TaskDir, tasks: Mapping[str, dict]) -> None:
    # Every worker has exited and nothing waits, yet a task has no result: say so rather than wait forever.
    for task_id in folder.outstanding(tasks):
        folder.finish("driver", task_id, {"status": LOST, "error": "no worker ran it to the end"})
