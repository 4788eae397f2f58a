"""The harness side of checked timed calls (``child.checked``): the reference child, and the checks on a stage.

A perf run's child saved its checked timed calls (inputs and results) in its private folder, and
the stage kept them beside its log (``<tag>-perf.checked/``) with their digests in the signed run
report (``Stage.checked``). ``check_stage`` then

1. refuses a capture whose bytes are not what the child signed (``tampered``);
2. copies the captures into a fresh private folder and runs one pytest child of the perf command,
   selected to the captured tests, in a checkout of the *reference* commit (the baseline: none of
   the candidate's code is in it), with ``CUTILE_PERF_CHECK_REPLAY``: its plugin replays the base
   kernel on the captured inputs and writes one signed ``check`` line per timed call;
3. returns the stage with ``checks``: one line per captured timed call, ``ok``, ``mismatch`` or
   ``unchecked`` with the reason, each with the case it belongs to, the bytes it moves and the
   bandwidth of its timing mode (``bandwidth.json`` in the sandbox: the first reference child's
   copy benchmark, kept for the session, so every floor is computed from one measurement).

The judge (``judge.verdict.judge_checks``) turns a mismatch or a record below the floor into a verdict.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from cutile_perf.child import records
from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.floor import floor_ms
from cutile_perf.judge.verdict import Stage
from cutile_perf.store import atomic, remove_tree

BANDWIDTH_FILE = "checked-bandwidth.json"


def captured(stage: Stage) -> list[dict]:
    return [line for line in stage.checked if line.get("type") == "checked"]


def _case_of(stage: Stage, nodeid: str) -> str:
    return next((case for case, test in stage.test_ids.items() if test == nodeid),
                records.shape_id(nodeid, "cutile") if "[" in nodeid else nodeid)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def session_bandwidth(sandbox: Path, measured: dict | None) -> dict | None:
    """The session's bandwidth: recorded by the first reference child that measured one, then kept."""
    path = sandbox / BANDWIDTH_FILE
    if path.exists():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass
    if measured:
        atomic.write_text(path, json.dumps(measured, indent=1) + "\n")
    return measured


def check_stage(session, stage: Stage, *, run_child, tag: str) -> Stage:
    """``stage`` with its ``checks`` (module docstring). ``run_child(select, extra_env, private, output)``
    runs the reference child in the reference commit's checkout and returns its run report."""
    lines = captured(stage)
    if not stage.ok or not lines:
        return stage
    folder = session.repo / Path(stage.output).with_suffix(".checked")
    checks: list[dict] = []
    wanted: list[dict] = []
    for line in lines:
        base = {"nodeid": line["nodeid"], "ordinal": line["ordinal"], "case": _case_of(stage, line["nodeid"]),
                "timer": line.get("timer", "")}
        if line.get("status") != "captured":
            checks.append({**base, "status": "unchecked", "reason": line.get("reason", "not captured")})
            continue
        if _digest(folder / line["file"]) != line.get("sha256"):
            return replace(stage, crash=CrashClass.TAMPERED,
                           detail=f"the checked timed call of {line['nodeid']} was changed after its child signed it")
        wanted.append({**line, **base})
    if not wanted:
        return replace(stage, checks=tuple(checks))
    private = Path(tempfile.mkdtemp(prefix="cutile-perf-reference-"))
    try:
        replay = private / "replay"
        replay.mkdir()
        for line in wanted:
            shutil.copyfile(folder / line["file"], replay / line["file"])
        (replay / "index.json").write_text(json.dumps(wanted), encoding="utf-8")
        output = session.sandbox / "runs" / f"{tag}-reference.log"
        report = run_child(sorted({line["nodeid"] for line in wanted}), {"CUTILE_PERF_CHECK_REPLAY": str(replay)},
                           private, output)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    results = {(c["nodeid"], c["ordinal"]): c for c in report.checked if c.get("type") == "check" and "nodeid" in c}
    measured = next((c["bandwidth"] for c in report.checked if c.get("type") == "check" and "bandwidth" in c), None)
    bandwidth = session_bandwidth(session.sandbox, measured) or {}
    for line in wanted:
        found = results.get((line["nodeid"], line["ordinal"]))
        base = {k: line[k] for k in ("nodeid", "ordinal", "case", "timer")}
        if found is None:
            outcome = report.outcomes.get(line["nodeid"], "not run")
            checks.append({**base, "status": "unchecked",
                           "reason": f"the reference child did not reach this timed call (its test: {outcome}; "
                                     f"see {output.name})"})
            continue
        gbps = bandwidth.get(found.get("l2") or line.get("l2") or "flushed")
        checks.append({**base, **{k: v for k, v in found.items() if k not in ("type", "seq", "mac")}, "gbps": gbps})
    return replace(stage, checks=tuple(checks))


def discard_captures(session, stage: Stage) -> None:
    """Delete a perf run's captured timed calls once judged (the reference's own runs are never
    checked): they can fill a disk, up to ``checked.capture_limit`` per child. A mismatch's or a
    tampered capture's stays beside the log as the evidence."""
    if not stage.output or stage.crash is CrashClass.TAMPERED:
        return
    if any(c.get("status") == "mismatch" for c in getattr(stage, "checks", ())):
        return
    remove_tree.remove_quietly(session.repo / Path(stage.output).with_suffix(".checked"))


def summary(checks) -> str:
    """One line for a row and ``status``: how many timed calls were checked, and why the others were not."""
    if not checks:
        return ""
    counts = {s: sum(1 for c in checks if c.get("status") == s) for s in ("ok", "mismatch", "unchecked")}
    text = f"checked timed calls: {counts['ok']} ok, {counts['mismatch']} mismatch, {counts['unchecked']} unchecked"
    why: dict[str, list[str]] = {}  # each reason once, with how many calls and a case it held for
    for c in checks:
        if c.get("status") == "unchecked":
            why.setdefault(_reason_kind(c.get("reason", "")), []).append(str(c.get("case")))
    if why:
        text += " (" + "; ".join(f"{len(cases)} {kind}, e.g. {cases[0]}" for kind, cases in why.items()) + ")"
    return text


def _reason_kind(reason: str) -> str:
    """A reason without its run-specific numbers (the MB saved so far), so that alike reasons count together."""
    return reason.split(" (", 1)[0] if "capture limit" in reason else reason


def row_fields(stages) -> dict:
    """The row's ``checked`` (``summary``), ``unchecked`` (each timed call no check could judge:
    case, call, why) and ``copy_floor_ms`` (``copy_floors``) over every perf run of an iteration; {}
    when none was checked. A case that cannot be checked is said on the row and in ``status``, never
    silently."""
    checks = [c for s in stages if s is not None for c in getattr(s, "checks", ())]
    if not checks:
        return {}
    unchecked = [{"case": c.get("case"), "call": c.get("ordinal"), "timer": c.get("timer"), "why": c.get("reason")}
                 for c in checks if c.get("status") == "unchecked"]
    floors = copy_floors(checks)
    return {"checked": summary(checks), **({"unchecked": unchecked} if unchecked else {}),
            **({"copy_floor_ms": floors} if floors else {})}


def copy_floors(checks) -> dict[str, float]:
    """Case -> the time its checked calls' tensors take to move once at the copy bandwidth measured
    on this GPU (ms; the most of its calls): the copy roofline a report compares a memory-bound
    case's median with (pure)."""
    floors: dict[str, float] = {}
    for c in checks:
        if c.get("status") == "ok" and c.get("case") and (c.get("bytes") or 0) > 0 and (c.get("gbps") or 0) > 0:
            floors[c["case"]] = max(floors.get(c["case"], 0.0), round(floor_ms(int(c["bytes"]), float(c["gbps"])), 6))
    return floors


def _sizes(node_id: str) -> frozenset[int]:
    """The integers of a test id's parameters (``test_perf[64-16384-cutile]`` -> {64, 16384})."""
    params = node_id.partition("[")[2].rstrip("]")
    return frozenset(int(t) for t in re.findall(r"(?<![\w.])\d+(?![\w.])", params))


def uncovered_perf_cases(correctness_ids, perf_ids) -> list[str]:
    """Perf test ids whose sizes no correctness test uses (best effort, pure): a perf case is covered
    when one correctness test id carries every integer of its parameters; a perf id without integer
    parameters is not judged. Checked timed calls cover these cases; init says which they are."""
    correct = [_sizes(i) for i in correctness_ids]
    return [p for p in perf_ids if (sizes := _sizes(p)) and not any(sizes <= c for c in correct)]
