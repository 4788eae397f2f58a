"""``sandbox/experiments.jsonl``: the append-only log that is the truth of a session.

One JSON object per line, one line per iteration (0 is the baseline). ``perf_results.md`` and
``report.md`` are rendered from it; ``resume`` reads only this and git. An entry holds:

    iteration      int, 0 = baseline
    optimization   str, one phrase ("baseline", "TMA replace gather")
    status         "keep" | "revert" | "crash"
    correctness    "PASS" | "FAIL"
    latency_ms     float | None: geometric mean of the per-shape medians (decide.combine_latency)
    shapes         {shape_id: {"median": ms, "test_id": ..., "runs": [per-run medians], "record": {...}}}
    decision       decide.Decision.to_dict() | None (None for the baseline and crashes)
    commit, crash_class, patch, timings, env, started, finished   (optional, recorded by the loop)

Appending writes one whole line, flushes and fsyncs before returning: a kill can only cut the
last line, which readers skip and report (``LogContents.truncated_tail``).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from cutile_perf.decide import IMPROVING_TIERS

STATUSES = ("keep", "revert", "crash")
CORRECTNESS = ("PASS", "FAIL")


@dataclass(frozen=True)
class LogContents:
    entries: list[dict]
    truncated_tail: str | None = None  # the last line, cut short by a kill mid-write
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line number, text) of unreadable lines


def validate_entry(entry: dict) -> None:
    """Raise ValueError naming every required field that is missing or malformed."""
    if not isinstance(entry, dict):
        raise ValueError(f"a log entry is a dict, not {type(entry).__name__}")
    problems = []
    if not (isinstance(entry.get("iteration"), int) and entry["iteration"] >= 0):
        problems.append(f"iteration={entry.get('iteration')!r} (int >= 0)")
    if not isinstance(entry.get("optimization"), str) or not entry["optimization"].strip():
        problems.append(f"optimization={entry.get('optimization')!r} (non-empty text)")
    if entry.get("status") not in STATUSES:
        problems.append(f"status={entry.get('status')!r} (one of {', '.join(STATUSES)})")
    if entry.get("correctness") not in CORRECTNESS:
        problems.append(f"correctness={entry.get('correctness')!r} (PASS or FAIL)")
    latency = entry.get("latency_ms")
    if latency is not None and not (isinstance(latency, (int, float)) and math.isfinite(latency) and latency > 0):
        problems.append(f"latency_ms={latency!r} (a positive number or None)")
    if problems:
        raise ValueError("bad log entry: " + "; ".join(problems))


def append_entry(path: str | Path, entry: dict) -> None:
    """Append one entry as one line; durable (fsync'd) when this returns."""
    validate_entry(entry)
    # allow_nan=False: NaN/inf are not JSON, and a line other tools cannot read is a lost iteration.
    line = json.dumps(entry, sort_keys=True, allow_nan=False, default=str)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        # A previous writer killed mid-line left no newline: end that line first, or this entry
        # would be glued onto the fragment and be lost with it.
        if fh.tell() > 0 and _last_byte(path) != b"\n":
            fh.write(b"\n")
        fh.write(line.encode("utf-8") + b"\n")
        fh.flush()
        os.fsync(fh.fileno())


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def read_log(path: str | Path) -> LogContents:
    """Every readable entry, in file order, plus what had to be skipped. A missing log is empty."""
    path = Path(path)
    if not path.exists():
        return LogContents([])
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    entries, skipped, tail = [], [], None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict):
                raise ValueError("not an object")
        except ValueError:
            skipped.append((number, line))
            if number == len(lines):  # no newline after it: the write was cut short
                tail = line
            continue
        entries.append(entry)
    return LogContents(entries, tail, skipped)


def read_entries(path: str | Path) -> list[dict]:
    """The readable entries; use ``read_log`` to learn what was skipped."""
    return read_log(path).entries


def current_baseline(entries: list[dict]) -> dict | None:
    """The entry whose numbers new candidates are compared with.

    The last kept entry that moved performance (iteration 0 included). A change kept as
    "no-change" stays in the code, but its numbers are the old ones plus noise, so they do not
    replace the reference: otherwise noise could ratchet the baseline slower, step by step.
    """
    for entry in reversed(entries):
        if entry.get("status") != "keep":
            continue
        if entry.get("iteration") == 0:
            return entry
        decision = entry.get("decision") or {}
        if decision.get("rebaseline", decision.get("tier") in IMPROVING_TIERS):
            return entry
    return None


def next_iteration(entries: list[dict]) -> int:
    return max((e.get("iteration", -1) for e in entries), default=-1) + 1


def shape_medians(entry: dict) -> dict[str, float]:
    """``{shape_id: median ms}`` of one entry."""
    return {sid: float(s["median"]) for sid, s in (entry.get("shapes") or {}).items() if s.get("median") is not None}
