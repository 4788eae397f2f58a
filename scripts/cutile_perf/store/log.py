"""``sandbox/experiments.jsonl``: the append-only log that is the truth of a session.

One JSON object per line, one line per iteration (0 is the baseline). ``perf_results.md`` and
``report.md`` are rendered from it; ``resume`` reads only this and git. An entry holds:

    iteration      int, 0 = baseline
    optimization   str, one phrase ("baseline", "TMA replace gather")
    status         "keep" | "revert" | "crash"
    correctness    "PASS" | "FAIL" | "not run" (interrupted before a verdict: judge.verdict.NOT_RUN)
    latency_ms     float | None: geometric mean of the per-shape medians (rules.combine_latency)
    shapes         {shape_id: {"median": ms, "test_id": ..., "runs": [per-run medians], "record": {...}}}
    decision       rules.Decision.to_dict() | None (None for the baseline and crashes)
    commit, crash_class, patch, timings, env, started, finished   (optional, recorded by the loop)

Appending writes one whole line, flushes and fsyncs before returning: a kill can only cut the
last line, which readers skip and report (``LogContents.truncated_tail``).

Hash chain: every entry's ``prev`` is the sha256 of the previous line's bytes (``GENESIS`` for
the first). ``check_chain`` finds the first line that does not follow from the one before it (a
hand edit, an inserted or deleted row), and with the row count and head hash that ``cutile-perf``
keeps beside the log (``Anchor``), a truncated tail too. This module only reads and writes;
what the rows mean is ``history``'s.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from cutile_perf.store import atomic

GENESIS = "genesis"

STATUSES = ("keep", "revert", "crash")
CORRECTNESS = ("PASS", "FAIL", "not run")


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
        problems.append(f"correctness={entry.get('correctness')!r} (one of {', '.join(CORRECTNESS)})")
    latency = entry.get("latency_ms")
    if latency is not None and not (isinstance(latency, (int, float)) and math.isfinite(latency) and latency > 0):
        problems.append(f"latency_ms={latency!r} (a positive number or None)")
    if problems:
        raise ValueError("bad log entry: " + "; ".join(problems))


def shape_medians(entry: dict) -> dict[str, float]:
    """``{case: median ms}`` of one row (cases recorded as text, "nan" or "inf", are left out)."""
    return {sid: float(s["median"]) for sid, s in (entry.get("shapes") or {}).items()
            if isinstance(s.get("median"), (int, float))}


def shape_test_ids(entry: dict) -> dict[str, str | None]:
    """``{case: the perf test's node id that recorded it}`` of one row (None where the row names none)."""
    return {sid: s.get("test_id") if isinstance(s, dict) else None for sid, s in (entry.get("shapes") or {}).items()}


def line_hash(line: str | bytes) -> str:
    data = line.encode("utf-8") if isinstance(line, str) else line
    return hashlib.sha256(data.rstrip(b"\n")).hexdigest()


def head_hash(path: str | Path) -> str:
    """The hash the next entry's ``prev`` must carry: the last complete line's, or GENESIS."""
    lines = _complete_lines(Path(path))
    return line_hash(lines[-1]) if lines else GENESIS


def _complete_lines(path: Path) -> list[bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return _lines_of(data)


def _lines_of(data: bytes) -> list[bytes]:
    lines = [ln for ln in data.split(b"\n") if ln.strip()]
    if lines and not data.endswith(b"\n"):
        lines.pop()  # cut short by a kill: not part of the chain
    return lines


def entry_line(entry: dict) -> str:
    # allow_nan=False: NaN/inf are not JSON, and a line other tools cannot read is a lost iteration.
    return json.dumps(entry, sort_keys=True, allow_nan=False, default=str)


def append_entry(path: str | Path, entry: dict) -> str:
    """Append one entry as one line, chained to the previous one; durable (fsync'd) when this returns.

    Returns the new line's hash (the chain head).
    """
    validate_entry(entry)
    entry = {**entry, "prev": head_hash(path)}
    line = entry_line(entry)
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
    return line_hash(line)


@dataclass(frozen=True)
class Anchor:
    """Row count and head hash of the log as the harness last wrote it (kept outside the sandbox)."""

    rows: int
    head: str

    @classmethod
    def read(cls, path: Path) -> Anchor | None:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(int(data["rows"]), str(data["head"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, path: Path) -> None:
        atomic.write_text(path, json.dumps({"rows": self.rows, "head": self.head}) + "\n")


def anchor_of(path: str | Path) -> Anchor:
    lines = _complete_lines(Path(path))
    return Anchor(len(lines), line_hash(lines[-1]) if lines else GENESIS)


def check_chain(path: str | Path, anchor: Anchor | None = None) -> str | None:
    """None when the log is intact; else one line saying where it breaks."""
    return check_lines(_complete_lines(Path(path)), anchor)


def check_lines(lines: list[bytes], anchor: Anchor | None = None) -> str | None:
    """``check_chain`` over the log's complete lines, already read."""
    prev = GENESIS
    for number, raw in enumerate(lines, start=1):
        try:
            entry = json.loads(raw)
        except ValueError:
            return f"line {number} is not JSON"
        if not isinstance(entry, dict) or entry.get("prev") != prev:
            return f"line {number} does not follow line {number - 1} (hash chain broken: edited, inserted or removed)"
        prev = line_hash(raw)
    if anchor is not None:
        if len(lines) < anchor.rows:
            return f"the log has {len(lines)} rows but {anchor.rows} were written (truncated after line {len(lines)})"
        if len(lines) > anchor.rows:
            return f"line {anchor.rows + 1} and later were not written by cutile-perf"
        if anchor.rows and prev != anchor.head:
            return f"line {len(lines)} is not the row cutile-perf wrote last"
    return None


@dataclass(frozen=True)
class Snapshot:
    """The log read once: its complete lines (the chain) and its readable entries, from the same bytes."""

    lines: list[bytes]
    contents: LogContents

    @classmethod
    def read(cls, path: str | Path) -> Snapshot:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            data = b""
        return cls(_lines_of(data), parse(data.decode("utf-8", errors="replace")))

    def anchor(self) -> Anchor:
        return Anchor(len(self.lines), line_hash(self.lines[-1]) if self.lines else GENESIS)


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def parse(text: str) -> LogContents:
    """Every readable entry of the log's text, in file order, plus what had to be skipped."""
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
