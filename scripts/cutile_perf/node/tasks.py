"""A folder of tasks that workers claim by rename: each task runs on one worker, its result is written once.

    root/queue/<task>.json            waiting (payload and attempt count)
    root/claimed/<worker>/<task>.json  one worker's, while it runs
    root/done/<task>.json             the result, written once

A claim is ``os.rename`` from queue/ into the worker's folder: of two workers renaming one file,
exactly one succeeds (AgentKernelArena's claim). A result is published with ``os.link`` of a fully
written temp file: a second publication of the same task fails instead of replacing the first, so
a task that somehow ran twice is still recorded once. A worker that died leaves its claims behind;
``release`` puts each back in the queue (attempt + 1) or, past ``max_attempts``, records it as lost,
so a task is never silently dropped.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

LOST = "lost"  # the status of a task whose workers all died running it


class TaskDir:
    """The three folders of one pool's tasks (module docstring)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.queue, self.claimed, self.done = self.root / "queue", self.root / "claimed", self.root / "done"
        for folder in (self.queue, self.claimed, self.done):
            folder.mkdir(parents=True, exist_ok=True)

    def submit(self, task_id: str, payload: dict, attempt: int = 1) -> None:
        _check_id(task_id)
        _write_new(self.queue / f"{task_id}.json", {"id": task_id, "payload": payload, "attempt": attempt})

    def claim(self, worker: str) -> dict | None:
        """The next waiting task, now this worker's; None when the queue is empty."""
        mine = self.claimed / worker
        mine.mkdir(exist_ok=True)
        for path in sorted(self.queue.glob("*.json")):
            try:
                os.rename(path, mine / path.name)  # atomic: another worker got it if this fails
            except FileNotFoundError:
                continue
            return json.loads((mine / path.name).read_text(encoding="utf-8"))
        return None

    def finish(self, worker: str, task_id: str, result: dict) -> bool:
        """Record the task's result once and drop the claim; False when it was already recorded."""
        recorded = _write_new(self.done / f"{task_id}.json", {"id": task_id, "worker": worker, **result})
        (self.claimed / worker / f"{task_id}.json").unlink(missing_ok=True)
        return recorded

    def release(self, worker: str, max_attempts: int) -> list[str]:
        """A dead worker's claims: back to the queue, or recorded as lost after ``max_attempts``
        tries; one already done is only unclaimed. Returns the ids put back in the queue."""
        requeued = []
        for path in sorted((self.claimed / worker).glob("*.json")):
            task = json.loads(path.read_text(encoding="utf-8"))
            if (self.done / path.name).exists():
                pass  # it finished just before the worker died: recorded already, never twice
            elif task["attempt"] >= max_attempts:
                self.finish(worker, task["id"], {"status": LOST, "error": f"its worker died {task['attempt']} time(s)"})
            else:
                self.submit(task["id"], task["payload"], task["attempt"] + 1)
                requeued.append(task["id"])
            path.unlink(missing_ok=True)
        return requeued

    def results(self) -> dict[str, dict]:
        return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(self.done.glob("*.json"))}

    def waiting(self) -> int:
        return sum(1 for _ in self.queue.glob("*.json"))

    def outstanding(self, ids: Iterable[str]) -> list[str]:
        """Of ``ids``, those with no result yet."""
        return [i for i in ids if not (self.done / f"{i}.json").exists()]


def _check_id(task_id: str) -> None:
    # An id is a file name: a slash or a leading dot would write outside the folder or hide the file.
    if not task_id or "/" in task_id or task_id.startswith(".") or os.sep in task_id:
        raise ValueError(f"a task id is a plain file name, not {task_id!r}")


def _write_new(path: Path, data: dict) -> bool:
    """Write ``data`` to ``path`` only if nothing is there: a complete temp file linked into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)  # fails if the file exists: never replaces a result
        return True
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)
