"""The worker both engines run: take a task, call the task function, return its result as data.

A task function is named ``"module:function"`` (importable in the worker: a process of its own,
or a Ray actor on another host, cannot be handed a closure); it takes the task's payload (a dict)
and returns a JSON-able dict. Its exception becomes the task's result (status "error"), never a
dead worker: a failure is a result.

``python -m cutile_perf.node.worker ROOT WORKER FUNCTION`` is the local engine's worker process:
it claims tasks from ``ROOT`` (``node.tasks``) until the queue is empty, then exits.
"""
from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from cutile_perf.node.tasks import TaskDir

OK, ERROR = "ok", "error"


def resolve(spec: str) -> Callable[[dict], dict]:
    """``"module:function"`` as the function it names; ValueError for a malformed name."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"a task function is named 'module:function', not {spec!r}")
    return getattr(importlib.import_module(module), name)


def run_task(spec: str, payload: dict) -> dict:
    """One task's result: {"status": "ok", "result": ...} or {"status": "error", "error": ...}."""
    try:
        return {"status": OK, "result": resolve(spec)(payload)}
    except Exception as exc:  # noqa: BLE001 - any failure of the task is its result
        tail = traceback.format_exc().strip().splitlines()[-3:]
        return {"status": ERROR, "error": f"{type(exc).__name__}: {exc}", "detail": "\n".join(tail)}


def work(root: Path, worker: str, spec: str) -> int:
    """Claim and run tasks until the queue is empty; returns how many this worker ran."""
    tasks = TaskDir(root)
    ran = 0
    while (task := tasks.claim(worker)) is not None:
        tasks.finish(worker, task["id"], {**run_task(spec, task["payload"]), "attempt": task["attempt"]})
        ran += 1
    return ran


def main(argv: list[str]) -> int:
    root, worker, spec = argv
    work(Path(root), worker, spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
