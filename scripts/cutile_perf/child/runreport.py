"""The signed run report a pytest child leaves for the harness: positive evidence, not exit codes.

The plugin (``pytest_plugin.RunReporter``) writes one JSON line per event: a test's outcome, a
benchmark record, the files the imported modules came from, the timing or reporting functions it
found replaced (``tampered``; readers that predate it ignore the line), and an end-of-session marker. Each
line carries a sequence number and an HMAC under a key the harness passed through a pipe. The
harness (``read``) then knows:

* which tests passed, skipped, xfailed or failed (an exit code of 0 says none of that);
* that the session reached its end (a child that called ``os._exit(0)`` mid-run has no marker);
* that no line was added, removed or altered by anyone but the plugin (a forged record has no
  valid signature; a deleted line leaves a gap in the sequence).

What it cannot know: code running inside the same process can reach the plugin's objects in
memory. The report raises the bar from "write a line to a file" to "patch the interpreter",
and the interleaved re-measurement and ``verify`` in fresh processes remain the backstop.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from cutile_perf.store import safe_read

# A report larger than this is not read: a line a test is ~300 bytes, so it holds ~200,000 tests.
REPORT_LIMIT = 64 * safe_read.MB
# How much of a failed test's message (``failure``) the plugin writes: the assertion, not its data.
FAILURE_CHARS = 2000

# Severity order of the outcomes of one test's phases.
OUTCOME_RANK = {"passed": 0, "xpassed": 1, "skipped": 2, "xfailed": 3, "failed": 4, "error": 5}


def outcome_of(when: str, outcome: str, wasxfail: bool) -> str | None:
    """One phase report as a test outcome, or None when the phase says nothing new."""
    if wasxfail:
        return "xfailed" if outcome == "skipped" else "xpassed"
    if when == "call":
        return outcome  # passed / failed / skipped (pytest.skip inside the test)
    if outcome == "skipped":
        return "skipped"
    if outcome == "failed":
        return "error"
    return None


def ids_digest(nodeids) -> str:
    """One digest of a set of test ids, the same in every child that selected the same tests."""
    return hashlib.sha256("\n".join(sorted(nodeids)).encode("utf-8")).hexdigest()


def new_key() -> bytes:
    return secrets.token_bytes(32)


def _sign(key: bytes, payload: dict) -> str:
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()


class Writer:
    def __init__(self, path: str | os.PathLike, key: bytes):
        self.path = Path(path)
        self.key = key
        self.seq = 0

    def write(self, payload: dict) -> None:
        line = {**payload, "seq": self.seq}
        line["mac"] = _sign(self.key, line)
        self.seq += 1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, allow_nan=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


@dataclass
class RunReport:
    outcomes: dict[str, str] = field(default_factory=dict)  # nodeid -> final outcome
    records: list[tuple[str, str, object]] = field(default_factory=list)  # (nodeid, outcome, benchmark value)
    modules: dict[str, str] = field(default_factory=dict)  # module name -> file it was imported from
    ended: bool = False
    exitstatus: int | None = None
    forged: list[str] = field(default_factory=list)  # lines that the plugin did not write
    shard: dict | None = None  # index, count, selected (of all shards), digest, mine (this share)
    # Timing or reporting functions the plugin saw replaced in the child ("tampered" lines; a report
    # from a plugin without the timer identity check has none).
    tampered: list[str] = field(default_factory=list)
    # nodeid -> the first line(s) of why it failed (pytest's crash message; a report from a plugin
    # that predates it has none): the classifier reads them, whatever the child printed.
    failures: dict[str, str] = field(default_factory=dict)
    # Checked timed calls (``child.checked``): "checked" lines of a perf child (what it captured),
    # "check" lines of a reference child (the verdict per timed call).
    checked: list[dict] = field(default_factory=list)

    def passed(self) -> set[str]:
        return {n for n, o in self.outcomes.items() if o == "passed"}


def read(path: str | os.PathLike, key: bytes) -> RunReport:
    """The report, with every unsigned, re-ordered or missing line listed in ``forged``."""
    report = RunReport()
    path = Path(path)
    if not os.path.lexists(path):
        return report
    try:
        _read_lines(safe_read.lines(path, REPORT_LIMIT), key, report)
    except OSError as exc:  # a FIFO, a device or a link in its place, or a flood: no evidence
        report.forged.append(f"the report file: {exc}")
    return report


def _read_lines(lines, key: bytes, report: RunReport) -> None:
    expected = 0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            mac = line.pop("mac")
        except (ValueError, KeyError, AttributeError, TypeError):
            report.forged.append(f"line {number}: not a report line")
            continue
        if not isinstance(mac, str) or not hmac.compare_digest(mac, _sign(key, line)):
            report.forged.append(f"line {number}: bad signature")
            continue
        if line.get("seq") != expected:
            report.forged.append(f"line {number}: sequence {line.get('seq')} where {expected} was due")
            expected = int(line.get("seq", expected)) + 1
            continue
        expected += 1
        kind = line.get("type")
        if kind == "test":
            report.outcomes[line["nodeid"]] = line["outcome"]
            if isinstance(line.get("failure"), str):
                report.failures[line["nodeid"]] = line["failure"][:FAILURE_CHARS]
        elif kind == "record":
            report.records.append((line["nodeid"], line.get("outcome", "passed"), line["benchmark"]))
        elif kind == "shard":
            report.shard = {k: line.get(k) for k in ("index", "count", "selected", "digest", "mine")}
        elif kind == "modules":
            report.modules = dict(line.get("files") or {})
        elif kind == "tampered":
            report.tampered.extend(str(f) for f in line.get("findings") or [])
        elif kind in ("checked", "check"):
            report.checked.append(line)
        elif kind == "end":
            report.ended = True
            report.exitstatus = line.get("exitstatus")


def merge_shards(reports: list[RunReport]) -> tuple[RunReport, str | None]:
    """The reports of k children that each ran one share of a selection (``CUTILE_PERF_SHARD``),
    as one report, and what is wrong with the split, or None.

    The split is sound when every child that ended reported a share, the k shares are the k
    indices of one split, all of one selection (same count and digest of node ids), and together
    they cover it. A child that died early has no end marker, so the merged report has none either.
    """
    merged = RunReport(ended=all(r.ended for r in reports))
    for index, report in enumerate(reports):
        merged.outcomes.update(report.outcomes)
        merged.failures.update(report.failures)
        merged.checked.extend(report.checked)
        merged.records.extend(report.records)
        merged.modules.update(report.modules)
        merged.forged.extend(f"shard {index}: {line}" for line in report.forged)
        merged.tampered.extend(f"shard {index}: {finding}" for finding in report.tampered)
        if report.exitstatus is not None:
            merged.exitstatus = max(merged.exitstatus or 0, report.exitstatus)
    shards = [r.shard for r in reports if r.shard is not None]
    if any(r.ended and r.shard is None for r in reports):
        return merged, "a shard child ended without reporting its share of the tests"
    if not shards:
        return merged, None
    if {(s["selected"], s["digest"], s["count"]) for s in shards} != {(shards[0]["selected"], shards[0]["digest"],
                                                                        len(reports))}:
        return merged, "the shard children did not select the same tests"
    if sorted(s["index"] for s in shards) != list(range(len(shards))) and merged.ended:
        return merged, "the shard children did not run the shares 0..k-1 once each"
    if merged.ended and sum(s["mine"] for s in shards) != shards[0]["selected"]:
        return merged, "the shards together did not cover the selected tests"
    return merged, None
