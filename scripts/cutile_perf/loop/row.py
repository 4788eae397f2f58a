"""The row an iteration appends to the log, and what it carries: the provenance every entry has,
the timings, the per-shape records, the saved patch, the commit's trailers, and a ``try`` row as a
command reports it. Pure builders over the state and the verdict; ``loop/iteration.py`` records them.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import math
import re
import time
from dataclasses import asdict, dataclass, field

from cutile_perf.child import checkrun, envcheck
from cutile_perf.errors import EXIT_CRASH, EXIT_OK, EXIT_REJECTED
from cutile_perf.judge import rules
from cutile_perf.judge.verdict import Evidence, Reference, Verdict, correctness_status, paired_samples
from cutile_perf.loop.iteration_state import State
from cutile_perf.output import Outcome
from cutile_perf.store import atomic, git_ops
from cutile_perf.store.session import Session
from cutile_perf.templating import format_change

TRAILER = "Cutile-Perf"


def slug(text: str, limit: int = 40) -> str:
    """``"occupancy 2 -> 4"`` -> ``"occupancy-2-4"``: a file-name-safe summary."""
    value = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (value[:limit].rstrip("-")) or "change"


def patch_name(number: int, optimization: str) -> str:
    """``"007-occupancy-2-4"``: the iteration zero-padded, so ``ls sandbox/patches`` lists them in order.

    The name is stored in ``iteration.json`` and the saved path in the row, so a state or a row written
    before padding (``7-occupancy-2-4``) keeps its own name: nothing looks a patch up by number."""
    return f"{number:03d}-{slug(optimization)}"


@dataclass
class Clock:
    """Wall time of the command and time spent inside pytest children, for the overhead figure."""

    start: float = field(default_factory=time.monotonic)
    children_s: float = 0.0
    # (stage, seconds) of each pytest child in order: where an iteration's time went
    # (benchmarks/harness_overhead.py --tilegym reads it).
    stages: list = field(default_factory=list)

    def add_child(self, seconds: float, stage: str = "child") -> None:
        self.children_s += seconds
        self.stages.append([stage, round(seconds, 3)])

    def timings(self) -> dict:
        """Wall time, children and harness; ``perf_s``, the perf run(s) of the whole selection, and,
        when the interleaved re-check ran, ``recheck_s`` and ``recheck_runs``: its share of the wall
        time (``total_s / perf_s`` is a try's cost in perf runs)."""
        total = time.monotonic() - self.start
        out = {"total_s": round(total, 4), "children_s": round(self.children_s, 4),
               "harness_s": round(max(total - self.children_s, 0.0), 4), "stages": list(self.stages)}
        recheck = [s for n, s in self.stages if "-confirm" in n]
        perf = [s for n, s in self.stages if n.endswith("-perf") and "-confirm" not in n]
        if perf:
            out["perf_s"] = round(sum(perf), 4)
        if recheck:
            out["recheck_s"], out["recheck_runs"] = round(sum(recheck), 4), len(recheck)
        return out


def base_entry(session: Session, *, iteration: int, optimization: str, status: str, correctness: str,
               commit: str | None, base_commit: str | None, clock: Clock, probe: envcheck.Probe | None = None,
               **extra) -> dict:
    """One log record with the provenance every entry carries; ``probe``: the command's environment check."""
    entry = {
        "iteration": iteration,
        "optimization": optimization,
        "status": status,
        "correctness": correctness,
        "commit": commit,
        "base_commit": base_commit,
        "kernel": session.kernel,
        "branch": session.branch,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "env": probe.result().record() if probe is not None else envcheck.snapshot(),
    }
    entry.update(extra)
    entry["timings"] = clock.timings()
    return entry


def shapes_field(medians: dict[str, float], test_ids: dict[str, str],
                 runs: dict[str, list[float]] | None = None) -> dict[str, dict]:
    """The log's per-shape record: median ms, the pytest node id and, when repeated, each run's median.

    A non-finite median (a ``bad-record`` crash) is kept as its text ("nan", "inf"): the log is
    strict JSON, and the row must still show what the run claimed.
    """
    out = {}
    for sid, median in medians.items():
        shown = median if isinstance(median, (int, float)) and math.isfinite(median) else str(median)
        out[sid] = {"median": shown, "test_id": test_ids.get(sid)}
        if runs and sid in runs:
            out[sid]["runs"] = runs[sid]
    return out


def fenced_content_hash(session: Session, g, commit: str) -> str:
    """sha256 over the fenced files of ``commit`` (each one's path, mode and blob sha, sorted): the
    same content tried again hashes alike, whatever its commit, message or base. Rows carry it as
    ``content_hash``, so a change reverted before is recognised (``reverted_before``)."""
    entries = sorted(f"{e.path}\0{e.mode}\0{e.sha}" for e in git_ops.tree_entries(g, commit)
                     if session.fenced(e.path))
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def reverted_before(rows: list[dict], content_hash: str) -> int | None:
    """The iteration of the last row reverted with this fenced content, or None. Trying a change
    again until one lucky run keeps it (one fast in 30 % of its processes was kept on its 7th
    identical try, issue 39) then needs the whole interleaved re-check (``Evidence.repeat_of``)."""
    return next((row.get("iteration") for row in reversed(rows)
                 if row.get("status") == "revert" and row.get("content_hash") == content_hash), None)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def prior_ratios(rows: list[dict], content_hash: str, ref: Reference) -> dict[str, tuple[float, ...]]:
    """Case -> the candidate's ratios to the baseline that earlier reverted rows of this fenced
    content measured (``Evidence.prior_ratios``): each interleaved pair's candidate run over its
    baseline run (the row's ``confirm``), and its single run over the recorded medians when it was
    judged against the same baseline commit. A "baseline-drift" row's pairs are left out: their
    baseline runs were off, so their ratios say nothing of the candidate (and that revert's advice
    is to try again)."""
    out: dict[str, list[float]] = {}
    for row in rows:
        if row.get("status") != "revert" or row.get("content_hash") != content_hash:
            continue
        if (row.get("decision") or {}).get("tier") == "baseline-drift":
            continue
        for case, sides in (row.get("confirm") or {}).items():
            for base, cand in zip(sides.get("base") or [], sides.get("candidate") or []):
                if _positive(base) and _positive(cand):
                    out.setdefault(case, []).append(cand / base)
        if row.get("reference_commit") == ref.commit:
            for case, shape in (row.get("shapes") or {}).items():
                median = shape.get("median") if isinstance(shape, dict) else None
                if _positive(median) and _positive(ref.medians.get(case)):
                    out.setdefault(case, []).append(median / ref.medians[case])
    return {case: tuple(ratios) for case, ratios in out.items()}


def commit_message(number: int, optimization: str, reference: str, extra: dict[str, str] | None = None) -> str:
    trailers = {"Iteration": str(number), "Baseline": reference, **(extra or {})}
    return f"cutile-perf {number}: {optimization}\n\n" + "\n".join(f"{TRAILER}-{k}: {v}" for k, v in trailers.items())


def save_patch(session: Session, g, base: str, paths: list[str], name: str) -> str | None:
    """Write the diff ``base`` -> work tree of ``paths`` (untracked files included) to ``sandbox/patches/``.

    Returns the repo-relative patch path, or None when there was nothing to save.
    """
    patch = git_ops.diff_patch(g, base, paths)
    if not patch.strip():
        return None
    target = session.sandbox / "patches" / f"{name}.patch"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(target, patch)
    return str(target.relative_to(session.repo))


def isolation(stages) -> str:
    """The row's ``sandbox`` field: "unshare" when every child ran in a box (``child.box``), else the
    first stage's "none: <why>" (never a silent fallback: status, report and verify show it)."""
    labels = [s.sandbox for s in stages if s is not None and s.sandbox]
    unboxed = [label for label in labels if label != "unshare"]
    return unboxed[0] if unboxed else ("unshare" if labels else "none: no child ran")



def _origin(state: State) -> dict:
    """Row fields naming where the change came from: the batch plan entry, when it is one."""
    return {"plan_entry": state.plan_entry} if state.plan_entry else {}


def verdict_row(session: Session, state: State, ref: Reference, verdict: Verdict, evidence: Evidence,
                runner_fields: dict, *, content_hash: str, clock: Clock, probe: envcheck.Probe | None) -> dict:
    """The row of a judged iteration: the verdict, the evidence it rests on and the change's provenance."""
    status, perf = verdict.action, evidence.perf
    fields_ = dict(crash_class=verdict.crash_class.value if verdict.crash_class else None,
                   patch=state.patch if status != "keep" else None, reason=verdict.reason,
                   review=verdict.review, reference_commit=ref.commit, content_hash=content_hash, **_origin(state))
    paired = paired_samples(evidence.pairs, sorted(ref.medians))
    if any(base for base, _ in paired.values()):
        # Only the cases the re-check measured (all of them, or the cases in doubt).
        fields_["confirm"] = {case: {"base": base, "candidate": cand} for case, (base, cand) in paired.items()
                              if base}
    if verdict.decision is not None:
        fields_["decision"] = asdict(verdict.decision)
    fields_.update(runner_fields)
    fields_["sandbox"] = isolation(evidence.stages())
    fields_.update(checkrun.row_fields([perf, *(run for pair in evidence.pairs for run in pair)]))
    if perf is not None and perf.shapes:
        fields_["shapes"] = shapes_field(perf.shapes, perf.test_ids)
        if status != "crash" and set(ref.medians) <= set(perf.shapes):
            fields_["latency_ms"] = rules.combine_latency({c: perf.shapes[c] for c in ref.medians})
    return base_entry(session, iteration=state.iteration, optimization=state.optimization,
                      status=status, correctness=correctness_status(verdict, perf_ran=perf is not None),
                      commit=state.candidate, base_commit=state.base, clock=clock, probe=probe, **fields_)


def unfinished_row(session: Session, state: State, verdict: Verdict, *, correctness_seen: str | None,
                   clock: Clock, probe: envcheck.Probe | None) -> dict:
    """The row of an iteration stopped before a verdict: a crash of ``verdict``'s class (``interrupted``
    for Ctrl-C, a kill or the job's budget), with what the correctness tests had shown by then."""
    return base_entry(session, iteration=state.iteration, optimization=state.optimization, status="crash",
                      correctness=correctness_status(verdict, perf_ran=False, seen=correctness_seen),
                      commit=state.candidate, base_commit=state.base, clock=clock, probe=probe,
                      crash_class=verdict.crash_class.value, patch=state.patch, reason=verdict.reason[:300],
                      **_origin(state))


def keep_message(state: State, reference_commit: str, verdict: Verdict, log_prev: str) -> str:
    """The kept commit's message: the iteration's trailers plus the verdict, its figures and the log's head."""
    d = verdict.decision
    extra = {"Verdict": f"keep ({d.tier})" if d else "keep"}
    if d is not None and d.geomean_change is not None:
        extra["Geomean"] = format_change(d.geomean_change)
    if d is not None and d.worst_shape:
        gate = d.gates.get(d.worst_shape)
        change = d.changes.get(d.worst_shape)
        extra["Worst-Case"] = (f"{d.worst_shape} {format_change(change) if change is not None else '?'}"
                               + (f" (gate {gate * 100:.1f} %)" if gate is not None else ""))
    extra["Log-Prev"] = log_prev
    if verdict.review:
        extra["Review"] = "claimed speedup beyond the plausibility factor; re-measured interleaved"
    return commit_message(state.iteration, state.optimization, reference_commit, extra)


def try_outcome(row: dict, stop: str | None) -> Outcome:
    """A ``try`` row as a command reports it: one line, its data, the exit code of its decision."""
    status = row["status"]
    code = {"keep": EXIT_OK, "revert": EXIT_REJECTED}.get(status, EXIT_CRASH)
    data = {"iteration": row["iteration"], "decision": status, "reason": row.get("reason", ""),
            "patch": row.get("patch"), "latency_ms": row.get("latency_ms"), "commit": row.get("commit"),
            "crash_class": row.get("crash_class"), "review": row.get("review", False), "stop": stop}
    text = decision_line(data)
    if stop:
        text += f"; stop: {stop}"
    return Outcome(text, data, code)


def decision_line(data: dict) -> str:
    """``iteration N: <decision> - <reason> (patch: ...)`` from a ``try`` result's data (stop rule not included)."""
    text = f"iteration {data['iteration']}: {data['decision']} - {data.get('reason', '')}"
    if data.get("patch"):
        text += f" (patch: {data['patch']})"
    return text
