"""One iteration's test stages: run the session's correctness or perf command and read what it produced.

A stage never raises for a failing kernel: it returns a ``Stage`` whose ``crash`` names the class
(see ``runner.CRASH_CLASSES``). Output files live in ``sandbox/runs/`` so a failure can be read later.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from cutile_perf import records, runner
from cutile_perf.session import Session

FRAMEWORK = "cutile"
DIRECTION = "forward"


@dataclass(frozen=True)
class Stage:
    name: str  # "correctness" or "perf"
    crash: str | None
    duration_s: float
    output: str  # repo-relative path of the pytest output
    shapes: dict[str, float] = field(default_factory=dict)  # shape id -> median ms (perf only)
    test_ids: dict[str, str] = field(default_factory=dict)  # shape id -> pytest node id
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.crash is None


class Deadline:
    """The iteration's time budget, shared by all of its pytest children."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.budget = seconds

    def left(self) -> float:
        return max(self.end - time.monotonic(), 0.0)


def _rel(session: Session, path: Path) -> str:
    return str(path.relative_to(session.repo))


def run_stage(session: Session, name: str, tag: str, deadline: Deadline) -> Stage:
    """Run the ``name`` command ("correctness" or "perf") once; ``tag`` names its output files."""
    runs = session.sandbox / "runs"
    output = runs / f"{tag}-{name}.log"
    argv = session.argv(name)
    env: dict[str, str] = {}
    records_file = runs / f"{tag}-{name}.records.jsonl"
    if name == "perf":
        records_file.unlink(missing_ok=True)
        argv = [*argv, *records.PYTEST_PLUGIN_ARGS]
        env["CUTILE_PERF_RECORDS"] = str(records_file)
    if deadline.left() <= 0:
        return Stage(name, "timeout", 0.0, _rel(session, output), detail="no time left in the iteration budget")
    result = runner.run(argv, cwd=session.repo, timeout_s=deadline.left(), output_path=output, env_overrides=env)
    crash = runner.classify(result)
    detail = _last_lines(result.tail()) if crash else ""
    if result.timed_out:
        detail = f"killed after the iteration budget of {deadline.budget:g} s"
    shapes: dict[str, float] = {}
    test_ids: dict[str, str] = {}
    if name == "perf" and crash is None:
        try:
            chosen = records.select_by_shape(records.read_records_file(records_file), FRAMEWORK, DIRECTION)
            shapes = {sid: rec.median for sid, rec in sorted(chosen.items())}
            test_ids = {sid: rec.test_id for sid, rec in chosen.items()}
        except records.RecordError as exc:
            crash, detail = "no-record", str(exc)
        if crash is None and not shapes:
            crash = "no-record"
            detail = (f"the perf command passed but recorded no '{FRAMEWORK}' benchmark "
                      "(does the perf test call record_property('benchmark', ...)?)")
    return Stage(name, crash, result.duration_s, _rel(session, output), shapes, test_ids, detail)


def _last_lines(text: str, count: int = 3) -> str:
    """The most telling lines of a pytest failure: error lines first, else the last lines."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E ") or "Error" in ln]
    chosen = errors[-count:] if errors else lines[-count:]
    return " | ".join(chosen)[:400]
