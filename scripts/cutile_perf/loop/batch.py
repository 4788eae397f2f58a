"""``cutile-perf batch PLAN``: the plan's candidates, one ``try`` each, in one GPU job.

For each entry: copy its candidate files over the fenced targets, then run ``try`` exactly as the
command does (commit, pristine checkouts, decision, keep or revert). The batch adds:

- The job's time (``--job-seconds``, ``--budget``; ``budget.Budget``). An entry starts when a
  typical try of this session still fits (``budget.estimate``, from the stage times the log
  measured). Every child's timeout ends with the budget; a try that the end cuts short is settled
  as ``interrupted`` (row, revert, the change in its patch) and the batch stops there.
- Continuing a plan. Entries the log already holds a decision for (their rows' ``plan_entry``) are
  skipped, so the next job, running the same command, goes on where the last one stopped; the plan
  file is never edited. An iteration that a killed job left is finished first (as ``resume`` does),
  and a candidate that such a job had copied over a target before its ``try`` began is put back.
- It refuses to start over the user's uncommitted fenced work (a candidate would overwrite it).
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from cutile_perf.child import envcheck
from cutile_perf.errors import EXIT_OK, EXIT_REJECTED, DirtyTree, NoChange, Refused, UsageError
from cutile_perf.loop import guards, iteration, plan
from cutile_perf.loop.iteration_state import State, state_key
from cutile_perf.loop.baseline import baseline
from cutile_perf.loop.budget import Budget, DoesNotFit, try_estimate, unmeasured_first_job_s
from cutile_perf.loop.stages import Stages
from cutile_perf.output import Outcome, say
from cutile_perf.store import git_ops
from cutile_perf.store import session as session_mod
from cutile_perf.store.history import History


def batch(*, repo: Path, plan_path: Path, budget_s: float | None, job_s: float | None = None,
          baseline_repeats: int | None = None, check_only: bool = False, stages: Stages | None = None,
          now: Callable[[], float] = time.monotonic) -> Outcome:
    """``stages`` and ``now``: what runs the tests and the job's clock (tests pass scripted ones)."""
    budget = Budget.for_job(budget_s, job_s, now)
    session = session_mod.load(repo)
    path = plan_path if plan_path.is_absolute() else Path.cwd() / plan_path
    try:
        entries = plan.parse(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read the plan {plan_path}: {exc.strerror or exc}") from exc
    plan.check(entries, root=session.repo, fenced=session.fenced)
    digests = [plan.digest(e, session.repo) for e in entries]
    if check_only:  # before a queued or billed GPU job: what would refuse it, found here for free
        return _check(session, entries, digests, budget, baseline_repeats)
    guards.require_gpu(session, envcheck.Probe())
    g = git_ops.open_repo(session.repo)
    guards.require_session_branch(session, g)  # before anything is put back or run
    actions = _finish_earlier_job(session, g, entries)
    _refuse_fenced_work(session, g, entries)
    history = History.open(session, g)
    if history.reference() is None:
        recorded = _record_missing_baseline(session, baseline_repeats, stages)
        if recorded.exit_code != EXIT_OK:
            return recorded
        history = History.open(session, g)

    decided, cut_before = history.decided_plan_entries(), history.cut_plan_entries()
    done: list[dict] = []
    passed_over: list[tuple[str, str]] = []  # (entry, why): not started, the entries after it were

    def still_open(first: int) -> list[tuple[str, str]]:
        return passed_over + [(e.optimization, "budget") for e, d in zip(entries[first:], digests[first:])
                              if d not in decided]

    for n, (entry, digest) in enumerate(zip(entries, digests), 1):
        if digest in decided:
            row = decided[digest]
            done.append({"entry": n, "optimization": entry.optimization, "decision": row["status"],
                         "iteration": row["iteration"], "reason": row.get("reason", ""), "commit": row.get("commit"),
                         "earlier": True})
            continue
        why = _not_worth_restarting(try_estimate(history.rows, session.thresholds), budget) if digest in cut_before else None
        if why:
            say(f"batch {n}/{len(entries)}: {entry.optimization}: not started ({why})")
            passed_over.append((entry.optimization, why))
            continue
        say(f"batch {n}/{len(entries)}: {entry.optimization}")
        for target, candidate in entry.files:
            shutil.copyfile(session.repo / candidate, session.repo / target)
        began = now()
        try:
            tried = iteration.try_change(session.repo, " ".join(entry.optimization.split()), stages=stages,
                                         budget=budget, plan_entry=digest)
        except NoChange:  # the candidate is the current code: nothing to measure
            done.append({"entry": n, "optimization": entry.optimization, "decision": "skipped",
                         "reason": "the candidate is the same as the kept code", "seconds": 0.0})
            continue
        except DoesNotFit as exc:  # checked under the lock, before anything moved
            git_ops.restore_paths(g, git_ops.head(g), [t for t, _ in entry.files])
            say(f"budget: {budget.elapsed():.0f} s used; {exc.message}")
            return _outcome(done, still_open(n - 1), actions)
        except Refused:
            # Refused before touching anything: take our copies back out, leave the rest to the user.
            git_ops.restore_paths(g, git_ops.head(g), [t for t, _ in entry.files])
            raise
        history = tried.history
        row = tried.row
        done.append({"entry": n, "optimization": entry.optimization, "decision": row["status"],
                     "iteration": row["iteration"], "reason": row.get("reason", ""),
                     "commit": row.get("commit"), "stop": tried.stop, "cut": tried.cut,
                     "seconds": round(now() - began, 1)})
        if tried.cut and budget.spent():
            return _outcome(done, still_open(n), actions)
        # Cut before a re-check that could not end in time: the time left may still hold the next entry.
    return _outcome(done, passed_over, actions)


def _record_missing_baseline(session, repeats: int | None, stages: Stages | None) -> Outcome:
    """The baseline a job records first when none is logged yet (``--baseline N``); Refused without N."""
    if repeats is None:
        raise Refused("no baseline recorded yet", "run `cutile-perf baseline` first, or pass --baseline N")
    say(f"no baseline yet: recording it first ({repeats} perf runs)")
    return baseline(repo=session.repo, repeats=repeats, stages=stages)


def _not_worth_restarting(expected, budget: Budget) -> str | None:
    """Why an entry cut short before is not started again, or None to start it.

    Cut short before, it most likely needs its re-check again, and starting it only to be cut again
    would spend the job on nothing; the entries after it may still fit.
    """
    if expected is None or budget.fits(expected.with_recheck_s):
        return None
    why = (f"cut short before; with its re-check it needs about {expected.with_recheck_s:.0f} s "
           f"(the re-check: {expected.recheck_basis()})")
    if budget.seconds is not None and expected.with_recheck_s > budget.seconds:
        why += f", more than a whole budget of {budget.seconds:.0f} s: give it a longer job"
    return why


def _own_copies(session, g, entries: list) -> list[str]:
    """Fenced paths whose uncommitted content is byte for byte a candidate the plan copies there:
    left by a job killed between the copy and its ``try`` (or by a compile-check by hand). The
    candidate is still in sandbox/, so putting the target back loses nothing."""
    candidates: dict[str, set[bytes]] = {}
    for entry in entries:
        for target, candidate in entry.files:
            candidates.setdefault(target, set()).add((session.repo / candidate).read_bytes())
    own = []
    for rel in guards.fenced_changes(session, git_ops.changed_paths(g)):
        target = session.repo / rel
        if rel in candidates and target.is_file() and not target.is_symlink() \
                and target.read_bytes() in candidates[rel]:
            own.append(rel)
    return own


def _finish_earlier_job(session, g, entries: list) -> list[str]:
    """What a killed job left, made consistent before this one starts; returns what was done."""
    actions: list[str] = []
    lock = session_mod.read_lock(session.repo)
    if State.exists(session) or (lock is not None and session_mod.lock_is_stale(lock)):
        say("an earlier run was stopped mid-command: finishing it first, as `cutile-perf resume` does")
        actions += iteration.resume_interrupted(session.repo).actions
    copies = _own_copies(session, g, entries)
    if copies:
        git_ops.restore_paths(g, git_ops.head(g), copies)
        actions.append(f"put back {', '.join(copies)} (a copy of a plan candidate, left uncommitted)")
    for line in actions:
        say(line)
    return actions


def _refuse_fenced_work(session, g, entries: list) -> None:
    own = set(_own_copies(session, g, entries))
    dirty = [p for p in guards.fenced_changes(session, git_ops.changed_paths(g)) if p not in own]
    if dirty:
        raise DirtyTree(f"uncommitted changes to fenced files: {', '.join(dirty)}; a candidate would overwrite them",
                        "try them (cutile-perf try) or stash them first")


def _check(session, entries: list, digests: list[str], budget: Budget, baseline_repeats: int | None) -> Outcome:
    """``--check``: everything ``batch`` verifies before it starts, with no GPU and nothing run, and
    how many of the entries still open a typical ``try`` of this session lets the budget hold. Exit
    1 when the job would not get to its first try."""
    g = git_ops.open_repo(session.repo)
    _refuse_fenced_work(session, g, entries)
    lines = [f"plan: {len(entries)} entries, candidate files present and inside the fence"]
    data: dict = {"entries": len(entries), "ready": True}
    try:
        guards.require_session_branch(session, g)
    except Refused as exc:  # the job would refuse at once: say so here, where it costs nothing
        lines.append(f"{exc.message}: the job would refuse; {exc.hint}")
        data["ready"], data["refused"] = False, exc.message
    pending = State.load(session, state_key(g)) if State.exists(session) else None
    if pending is not None:
        lines.append(f"iteration {pending.iteration} was interrupted: the job finishes it first, as `cutile-perf "
                     "resume` does")
    # That iteration's own row may already be in the log, beyond its anchor (the job records it once).
    history = History.open(session, g, pending_row=pending.row if pending is not None and pending.step == "decided"
                           else None)
    copies = _own_copies(session, g, entries)
    if copies:
        lines.append(f"{', '.join(copies)} holds a plan candidate, uncommitted: the job puts it back first")
    decided = history.decided_plan_entries()
    open_entries = [d for d in digests if d not in decided]
    data["decided_earlier"] = len(entries) - len(open_entries)
    if data["decided_earlier"]:
        lines.append(f"{data['decided_earlier']} entries already decided (in the log): skipped")
    if not open_entries:
        lines.append("every entry is decided: nothing left to run")
        data["ready"] = False
    if history.reference() is None:
        if baseline_repeats is None:
            lines.append("no baseline yet: this job would refuse; pass --baseline N to record it first in the same job")
            data["ready"] = False
        else:
            lines.append(f"no baseline yet: the job records it first ({baseline_repeats} perf runs); how long a try "
                         "takes is known only after that, so the budget is applied from then on")
            if budget.seconds is not None and session.timing.get("method") == "cupti":
                # A TileGym-shaped target: warn when even its cheapest ops would not reach a verdict.
                low, high = unmeasured_first_job_s(baseline_repeats)
                data["first_verdict_seconds"] = [low, high]
                if budget.seconds < high:
                    data["verdict_at_risk"] = True
                    lines.append(
                        f"warning: on TileGym ops timed so far (H200, CUPTI, 16 perf cases), the baseline and one try "
                        f"took about {low:.0f}-{high:.0f} s; this budget is {budget.seconds:.0f} s, so the job "
                        + ("holds no verdict" if budget.seconds < low else "may record the baseline and no try")
                        + " (SKILL.md: a job too short for the loop is for readings)")
    expected = try_estimate(history.rows, session.thresholds)
    data["try_seconds"] = round(expected.typical_s, 1) if expected else None
    data["try_seconds_bound"] = round(expected.worst_s, 1) if expected else None
    data["budget_s"] = budget.seconds
    if expected is not None:
        lines.append(expected.describe())
        if budget.seconds is not None:
            fit = min(len(open_entries), int(budget.seconds // expected.typical_s)) if expected.typical_s > 0 \
                else len(open_entries)
            lines.append(f"a budget of {budget.seconds:.0f} s holds {fit} of the {len(open_entries)} open entries "
                         "at that typical time; an entry cut short by the budget's end is tried again by the next job")
            data["entries_that_fit"] = fit
            data["ready"] = data["ready"] and fit > 0
    lines += [f"note: {line}" for line in session.changes_from_init()]
    lines.append(_readiness_line(data))
    return Outcome("\n".join(lines), data, EXIT_OK if data["ready"] else EXIT_REJECTED)


def _readiness_line(data: dict) -> str:
    """The check's last line. A job the budget warning says may end before a verdict can still run
    (it records the baseline, a reading), so it is not refused, but it is not called plainly ready."""
    if not data["ready"]:
        return "NOT READY: the GPU job would not reach its first try"
    if data.get("verdict_at_risk"):
        return "the GPU job can start, but by the warning above it may end before any verdict"
    return "ready for the GPU job"


def _outcome(done: list[dict], not_started: list[tuple[str, str]], actions: list[str]) -> Outcome:
    def line(d: dict) -> str:
        text = f"{d['entry']}. {d['optimization']}: {d['decision']}"
        if d.get("earlier"):
            text += f" (iteration {d['iteration']}, decided by an earlier job)"
        elif d.get("iteration") is not None:
            text += f" (iteration {d['iteration']}, {d['seconds']:.0f} s)"
        if d.get("cut"):
            return text + f" - no verdict ({d['cut']}): the next job tries it again"
        return text + (f" - {d['reason']}" if d.get("reason") else "")

    lines = [*actions, *(line(d) for d in done)]
    lines += [f"not started ({why}): {name}" for name, why in not_started]
    now = [d for d in done if not d.get("earlier")]
    kept = sum(1 for d in now if d["decision"] == "keep")
    cut = next((d["optimization"] for d in now if d.get("cut")), None)
    summary = f"{len(now)} tried, {kept} kept, {len(not_started)} not started"
    if len(now) < len(done):
        summary += f", {len(done) - len(now)} decided earlier"
    if cut or not_started:
        summary += "; run the same command in the next job to continue the plan"
    lines.append(summary)
    return Outcome("\n".join(lines), {"entries": done, "not_started": [name for name, _ in not_started], "kept": kept,
                                      "cut": cut, "actions": actions}, EXIT_OK)
