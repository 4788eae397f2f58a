"""``cutile-perf batch PLAN``: the plan's candidates, one ``try`` each, in one GPU job.

For each entry: copy its candidate files over the fenced targets, then run ``try`` exactly as the
command does (commit, pristine checkouts, decision, keep or revert). The batch adds two things:
it refuses to start over uncommitted fenced work (copying a candidate would overwrite it), and with
``--budget`` it starts an entry only when the longest ``try`` the log allows for (correctness, perf
and a full interleaved re-check at the slowest child seen) still fits, so the job's own time limit
never cuts an iteration in half.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from cutile_perf.child import envcheck
from cutile_perf.errors import EXIT_OK, EXIT_REJECTED, DirtyTree, NoChange, Refused, UsageError
from cutile_perf.loop import iteration, plan
from cutile_perf.loop.baseline import baseline
from cutile_perf.loop.history import History
from cutile_perf.output import Outcome, say
from cutile_perf.store import git_ops
from cutile_perf.store import session as session_mod


def batch(*, repo: Path, plan_path: Path, budget_s: float | None, baseline_repeats: int | None = None,
          check_only: bool = False) -> Outcome:
    start = time.monotonic()
    if budget_s is not None and not budget_s > 0:
        raise UsageError(f"--budget must be a positive number of seconds, not {budget_s!r}")
    session = session_mod.load(repo)
    path = plan_path if plan_path.is_absolute() else Path.cwd() / plan_path
    try:
        entries = plan.parse(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read the plan {plan_path}: {exc.strerror or exc}") from exc
    plan.check(entries, root=session.repo, in_fence=session.in_fence)
    if check_only:  # before a queued or billed GPU job: what would refuse it, found here for free
        return _check(session, entries, budget_s, baseline_repeats)
    iteration.require_gpu(session, envcheck.Probe())
    g = git_ops.open_repo(session.repo)
    _refuse_fenced_work(session, g)
    history = History.open(session, g)
    if history.reference() is None:
        if baseline_repeats is None:
            raise Refused("no baseline recorded yet", "run `cutile-perf baseline` first, or pass --baseline N")
        say(f"no baseline yet: recording it first ({baseline_repeats} perf runs)")
        recorded = baseline(repo=session.repo, repeats=baseline_repeats)
        if recorded.exit_code != EXIT_OK:
            return recorded
        history = History.open(session, g)

    done: list[dict] = []
    for n, entry in enumerate(entries, 1):
        bound = history.try_seconds_bound(session.thresholds.max_confirm_pairs)
        elapsed = time.monotonic() - start
        if not plan.fits(elapsed, bound, budget_s):
            left = [e.optimization for e in entries[n - 1:]]
            say(f"budget: {elapsed:.0f} s used, a try can take {bound:.0f} s, {budget_s:.0f} s allowed; "
                f"not started: {len(left)}")
            return _outcome(done, left)
        say(f"batch {n}/{len(entries)}: {entry.optimization}")
        for target, candidate in entry.files:
            shutil.copyfile(session.repo / candidate, session.repo / target)
        began = time.monotonic()
        try:
            tried = iteration.try_change(session.repo, " ".join(entry.optimization.split()))
        except NoChange:  # the candidate is the current code: nothing to measure
            done.append({"entry": n, "optimization": entry.optimization, "decision": "skipped",
                         "reason": "the candidate is the same as the kept code", "seconds": 0.0})
            continue
        except Refused:
            # Refused before touching anything: take our copies back out, leave the rest to the user.
            git_ops.restore_paths(g, git_ops.head(g), [t for t, _ in entry.files])
            raise
        history = tried.history
        row = tried.row
        done.append({"entry": n, "optimization": entry.optimization, "decision": row["status"],
                     "iteration": row["iteration"], "reason": row.get("reason", ""),
                     "commit": row.get("commit"), "stop": tried.stop,
                     "seconds": round(time.monotonic() - began, 1)})
    return _outcome(done, [])


def _refuse_fenced_work(session, g) -> None:
    dirty = iteration.fenced_changes(session, git_ops.changed_paths(g))
    if dirty:
        raise DirtyTree(f"uncommitted changes to fenced files: {', '.join(dirty)}; a candidate would overwrite them",
                        "try them (cutile-perf try) or stash them first")


def _check(session, entries: list, budget_s: float | None, baseline_repeats: int | None) -> Outcome:
    """``--check``: everything ``batch`` verifies before it starts, with no GPU and nothing run, and
    how many entries the budget can hold at the log's worst-case ``try``. Exit 1 when the job would
    not get to its first try."""
    g = git_ops.open_repo(session.repo)
    _refuse_fenced_work(session, g)
    history = History.open(session, g)
    lines = [f"plan: {len(entries)} entries, candidate files present and inside the fence"]
    data: dict = {"entries": len(entries), "ready": True}
    if history.reference() is None:
        if baseline_repeats is None:
            lines.append("no baseline yet: this job would refuse; pass --baseline N to record it first in the same job")
            data["ready"] = False
        else:
            lines.append(f"no baseline yet: the job records it first ({baseline_repeats} perf runs); the time a try "
                         "can take is known only after that, so --budget is applied from then on")
    bound = history.try_seconds_bound(session.thresholds.max_confirm_pairs)
    data["try_seconds_bound"] = bound
    if bound is not None:
        lines.append(f"a try can take up to {bound:.0f} s (the log's slowest correctness and perf runs, "
                     f"plus {session.thresholds.max_confirm_pairs} interleaved re-check pairs)")
        if budget_s is not None:
            fit = min(len(entries), int(budget_s // bound))
            lines.append(f"--budget {budget_s:.0f} s holds {fit} of the {len(entries)} entries at that bound")
            data["entries_that_fit"] = fit
            data["ready"] = data["ready"] and fit > 0
    lines += [f"note: {line}" for line in session.changes_from_init()]
    lines.append("ready for the GPU job" if data["ready"] else "NOT READY: the GPU job would not reach its first try")
    return Outcome("\n".join(lines), data, EXIT_OK if data["ready"] else EXIT_REJECTED)


def _outcome(done: list[dict], not_started: list[str]) -> Outcome:
    lines = [f"{d['entry']}. {d['optimization']}: {d['decision']}"
             + (f" (iteration {d['iteration']}, {d['seconds']:.0f} s)" if d.get("iteration") is not None else "")
             + (f" - {d['reason']}" if d.get("reason") else "") for d in done]
    lines += [f"not started (budget): {name}" for name in not_started]
    kept = sum(1 for d in done if d["decision"] == "keep")
    lines.append(f"{len(done)} tried, {kept} kept, {len(not_started)} not started")
    return Outcome("\n".join(lines), {"entries": done, "not_started": not_started, "kept": kept}, EXIT_OK)
