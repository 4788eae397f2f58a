"""Task functions for tests/test_node_*.py: importable by name in a worker process or a Ray actor
(the tests put this folder on PYTHONPATH), as real task functions are."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _note_run(payload: dict) -> None:
    # One line per run of the task, so a test can tell "ran twice" from "recorded twice".
    if payload.get("runs"):
        with open(payload["runs"], "a", encoding="utf-8") as fh:
            fh.write(f"{payload.get('value')}\n")


def echo(payload: dict) -> dict:
    _note_run(payload)
    time.sleep(payload.get("sleep", 0))
    return {"value": payload["value"], "device": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}


def boom(payload: dict) -> dict:
    raise RuntimeError(f"task {payload['value']} failed")


def _first_time(marker: str, text: str = "") -> bool:
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, text.encode())
    os.close(fd)
    return True


def die_once(payload: dict) -> dict:
    """Kills its own worker process on its first run (the worker dies mid-task), then succeeds."""
    _note_run(payload)
    if payload.get("marker") and _first_time(payload["marker"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return {"value": payload["value"]}


def die_always(payload: dict) -> dict:
    _note_run(payload)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def hang_once(payload: dict) -> dict:
    """On its first run writes its Ray actor's name to the marker and waits to be killed; then succeeds."""
    _note_run(payload)
    import ray  # only in the Ray tests

    if payload.get("marker") and _first_time(payload["marker"] + ".once"):
        Path(payload["marker"] + ".tmp").write_text(ray.get_runtime_context().get_actor_name(), encoding="utf-8")
        os.replace(payload["marker"] + ".tmp", payload["marker"])  # whole, or not there
        time.sleep(120)
    return {"value": payload["value"]}


def marker_text(path: str | Path) -> str:
    return Path(path).read_text(encoding="utf-8")
