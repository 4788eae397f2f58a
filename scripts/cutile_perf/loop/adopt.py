"""``resume``'s two ways on when the log's last kept commit is no longer on the session branch.

``offbranch`` recognises the state (the kept commit amended, rebased or reset away); the user picks:

* ``adopt``: the branch's head is re-measured like the baseline (correctness with the baseline's
  passing tests, then as many perf runs as the baseline made) in pristine checkouts, and recorded
  as a kept row that becomes the new reference. The log's chain of kept rows then ends at a commit
  the branch holds, with numbers measured on that commit; the user's commit is not touched.
* ``reset_to_kept``: the branch moves back to the kept commit; the user's commit stays on a backup
  branch (``cutile-perf/rewritten-<short>``) whose name is printed.

Both refuse to start on uncommitted work they could lose or would misread.
"""
from __future__ import annotations

from cutile_perf.child import envcheck, measure
from cutile_perf.errors import DirtyTree, IterationCrashed, Refused
from cutile_perf.judge import rules, stats, verdict
from cutile_perf.loop import guards, offbranch, render, row as row_mod
from cutile_perf.loop.baseline import perf_repeats
from cutile_perf.loop.stages import StageRunner
from cutile_perf.output import say
from cutile_perf.store import git_ops
from cutile_perf.store.history import History
from cutile_perf.store.session import Session
from cutile_perf.templating import format_change

ADOPTED_TIER = "adopted"


def _uncommitted(session: Session, g) -> list[str]:
    """Every uncommitted path but the harness's own sandbox and bytecode caches."""
    return [p for p in git_ops.changed_paths(g) if not p.startswith("sandbox/") and not guards.bytecode_cache(p)]


def _refuse_what_cannot_be_adopted(session: Session, g, history: History, off: offbranch.OffBranch) -> list[str]:
    """The checks before anything runs; returns the fenced paths the adopted commit changes."""
    head = git_ops.short(g, off.head)
    unfenced = guards.unfenced_since_base(session, g, off.head)
    if unfenced:
        raise Refused(f"{head} changes paths outside the fence since the session's base ({', '.join(unfenced[:5])}); "
                      "the loop measures those from the base, so it cannot adopt it",
                      f"`cutile-perf resume {offbranch.RESET_FLAG}` returns to the kept commit, or start a new "
                      "session with init on this branch")
    dirty = [p for p in _uncommitted(session, g) if session.fenced(p)]
    if dirty:
        raise DirtyTree(f"uncommitted change to {', '.join(dirty[:5])}: adopt measures the committed {head}, "
                        "not the work tree", "commit or stash it first")
    guards.require_baseline_env(history)
    changed = [p for p in git_ops.changed_between(g, off.kept, off.head) if session.fenced(p)]
    # The tree is clean, so the work tree holds the adopted commit's fenced files: the static scan
    # of what it adds over the kept commit is the one ``try`` runs.
    guards.refuse_probes(g, off.kept, changed)
    return changed


def adopt(session: Session, g, history: History, off: offbranch.OffBranch,
          probe: envcheck.Probe | None = None) -> str:
    """Re-measure the branch's head and record it as the new reference; returns the action line.

    A failure (a test, a record, a kernel the fenced files do not define) records nothing: the
    state stays as it was, and ``status`` still names it."""
    clock = row_mod.Clock()
    _refuse_what_cannot_be_adopted(session, g, history, off)
    head, short, kept_short = off.head, git_ops.short(g, off.head), git_ops.short(g, off.kept)
    reference = history.reference()
    number = history.next_iteration()
    repeats = max(1, int((history.first() or {}).get("repeats") or 1))
    tag = f"{number}-adopt"
    runner = StageRunner(session, g, measure.Deadline(session.timeout_s * (repeats + 1)), clock,
                         preload=history.preload())
    with runner:
        say(f"adopt {short}: correctness")
        corr = runner.stage("correctness", tag, head)
        checked = verdict.judge_correctness(corr, reference)
        if checked.final:
            raise IterationCrashed(f"{short} cannot be adopted: {checked.reason}; nothing was recorded",
                                   f"read {corr.output}; `cutile-perf resume {offbranch.RESET_FLAG}` returns to "
                                   f"the kept commit {kept_short}")
        test_ids: dict[str, str] = {}
        names: dict[str, str] = {}
        runs = perf_repeats(runner, session.thresholds, head, repeats, test_ids, names, tag=tag,
                            what=f"adopting {short}:")
        defined = runner.defined_names(head)
        fields_of_runner = runner.row_fields()
    missing = sorted(set(reference.medians) - set(runs))
    if missing:
        raise IterationCrashed(f"{short} cannot be adopted: no record in every perf run for {len(missing)} baseline "
                               f"case(s), e.g. {missing[0]}; nothing was recorded", "check the perf command")
    wrong = sorted(c for c, n in reference.kernel_names.items()
                   if not (names.get(c) and verdict.names_defined(names[c], defined)))
    if wrong:
        raise IterationCrashed(f"{short} cannot be adopted: case {wrong[0]} measured kernel {names.get(wrong[0])!r}, "
                               "which its fenced files do not define (measured-wrong-code); nothing was recorded")
    # The reference's cases only: the next candidate is judged on exactly these.
    shapes = {c: stats.median(runs[c]) for c in sorted(reference.medians)}
    change = stats.geomean([shapes[c] / reference.medians[c] for c in shapes]) - 1
    implausible = verdict.implausible_cases(reference, shapes, session.thresholds)
    how = f" ({off.how} as {git_ops.short(g, off.twin)})" if off.twin else ""
    reason = (f"adopted {short} in place of the kept commit {kept_short}{how}, re-measured: "
              f"{format_change(change)} against the reference {git_ops.short(g, reference.commit)}")
    row = row_mod.base_entry(
        session, iteration=number, optimization=f"adopt {short} (kept commit {kept_short} rewritten)", status="keep",
        correctness="PASS", commit=head, base_commit=off.kept, clock=clock, probe=probe,
        latency_ms=rules.combine_latency(shapes), shapes=row_mod.shapes_field(shapes, test_ids, runs),
        repeats=repeats, crash_class=None, patch=None, reason=reason, reference_commit=reference.commit,
        # rebaseline: its numbers replace the reference (``rules.moved_performance``), whatever they are.
        decision={"tier": ADOPTED_TIER, "rebaseline": True, "geomean_change": change, "reason": reason},
        adopted={"kept": off.kept, "rewritten_as": off.twin, "recognised_by": off.how},
        review=bool(implausible), sandbox=row_mod.isolation([corr]), **fields_of_runner)
    history.record(row)
    render.write_perf_results(session.results_path, history.rows)
    flag = (f"; review: {', '.join(implausible)} claim(s) more than {session.thresholds.plausible_factor:g}x faster "
            "than the reference, unconfirmed by an interleaved re-check" if implausible else "")
    return (f"iteration {number}: adopted {short} as the new reference ({rules.combine_latency(shapes):.6f} ms, "
            f"{format_change(change)} against {git_ops.short(g, reference.commit)}); the kept commit "
            f"{kept_short} it replaces is no longer on the branch{flag}")


def reset_to_kept(session: Session, g, history: History, off: offbranch.OffBranch,
                  probe: envcheck.Probe | None = None) -> str:
    """Move the session branch back to the kept commit, the user's commit kept on a backup branch;
    returns the action line naming that branch."""
    dirty = _uncommitted(session, g)
    if dirty:
        raise DirtyTree(f"uncommitted change to {', '.join(dirty[:5])}: moving the branch would mix it with "
                        "another commit's files", "commit or stash it first")
    head, kept = git_ops.short(g, off.head), git_ops.short(g, off.kept)
    kept_aside = f"{head} was behind it on the branch's history, so nothing left the branch"
    if not off.behind:
        name = _free_backup_name(g, off.head)
        if git_ops.branch_sha(g, name) != off.head:
            git_ops.create_branch_at(g, name, off.head)
        kept_aside = f"your commit {head} is kept on branch {name} (git log {name})"
    git_ops.move_branch_keeping_work(g, off.kept)
    return f"moved branch {session.branch} back to the kept commit {kept}; {kept_aside}"


def _free_backup_name(g, sha: str) -> str:
    """``cutile-perf/rewritten-<short>``, or with ``-2``, ``-3``, ... when that name holds another commit."""
    base = offbranch.backup_name(g, sha)
    name, k = base, 1
    while git_ops.branch_sha(g, name) not in (None, sha):
        k += 1
        name = f"{base}-{k}"
    return name
