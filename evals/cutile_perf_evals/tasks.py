"""The eval tasks of ``evals/evals.json``: loading, and the few questions the runner asks of a task.

A task is a plain dict (the JSON object); this module names its parts so the rest of the code
never digs through raw keys twice. The schema is described in ``evals/README.md``.
"""
from __future__ import annotations

import json
from pathlib import Path

from cutile_perf_evals import EVALS_DIR

EVALS_FILE = EVALS_DIR / "evals.json"
KINDS = ("optimization", "autotuning", "analysis", "triton", "recovery", "setup", "negative")
SOURCES = ("bundled", "fixture", "tilegym", "copy", "none")
# Kinds graded by measured speedup against a reference (a recovery task continues an optimization).
MEASURED_KINDS = ("optimization", "recovery")
TO_BE_MEASURED = "to be measured"
# A reference that was timed and was not faster than the task's start: no yardstick to grade a
# fraction against (the grade reports success only) until a faster reference is measured.
NOT_FASTER = "reference not faster"


class TaskError(ValueError):
    """A task that cannot be used as written (unknown id, bad setup)."""


def load(path: Path = EVALS_FILE) -> dict:
    """The whole file: ``{"schema", "skill", "prompt_suffix", "evals": [...]}``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskError(f"cannot read tasks file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("evals"), list):
        raise TaskError(f"{path}: expected an object with an 'evals' list")
    return data


def load_tasks(path: Path = EVALS_FILE) -> list[dict]:
    return load(path)["evals"]


def by_id(tasks: list[dict], task_id: str) -> dict:
    for task in tasks:
        if task["id"] == task_id:
            return task
    raise TaskError(f"unknown task {task_id!r}; known: {', '.join(t['id'] for t in tasks)}")


def select(tasks: list[dict], ids: list[str] | None = None, kinds: list[str] | None = None) -> list[dict]:
    """Tasks named in ``ids`` (in that order), else those of ``kinds``, else all."""
    if ids:
        return [by_id(tasks, i) for i in ids]
    if kinds:
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise TaskError(f"unknown kind(s) {sorted(unknown)}; known: {', '.join(KINDS)}")
        return [t for t in tasks if t["kind"] in kinds]
    return list(tasks)


def source(task: dict) -> str:
    return task.get("setup", {}).get("source", "none")


def is_measured(task: dict) -> bool:
    """Graded by speedup: the task has a fence, a test and a reference to compare with."""
    crit = task.get("pass_criteria") or {}
    return task["kind"] in MEASURED_KINDS and bool(crit.get("fence")) and bool(crit.get("test"))


def fence(task: dict) -> list[str]:
    return list((task.get("pass_criteria") or {}).get("fence", []))


def test_file(task: dict) -> str | None:
    return (task.get("pass_criteria") or {}).get("test")


def check(task: dict) -> str | None:
    """A hidden pytest file (``fixture:checks/...``) run on HEAD in a clean checkout; None when none."""
    return (task.get("pass_criteria") or {}).get("check")


def reference(task: dict) -> dict[str, str]:
    """``{fenced path: source}`` of the known faster version; empty when none is known."""
    return dict((task.get("pass_criteria") or {}).get("reference") or {})


def known_speedup(task: dict) -> dict:
    """``{"value": float | "to be measured", "source": str, ...}``; empty when the task has none."""
    return dict((task.get("pass_criteria") or {}).get("known_speedup") or {})


def reference_is_yardstick(task: dict) -> bool:
    """False when the task's reference was measured not faster than its start (``NOT_FASTER``): the
    grade then neither times it nor scores a fraction of it."""
    return known_speedup(task).get("value") != NOT_FASTER


def cited_speedup(task: dict) -> float | None:
    value = known_speedup(task).get("value")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def prompt(task: dict, suffix: str = "") -> str:
    """The text given to the agent: the question verbatim, then the file's common suffix."""
    text = task["question"].strip()
    return f"{text}\n\n{suffix.strip()}\n" if suffix.strip() else text + "\n"
