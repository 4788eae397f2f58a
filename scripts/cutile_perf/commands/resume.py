"""``cutile-perf resume``: after a crash or kill, rebuild state from the log and git; leave the repo consistent.

Consistent means: HEAD is the last kept commit and the fenced files equal it. Whatever the killed
iteration left (an unlogged commit, a half-applied or half-confirmed candidate) is saved as a
patch before anything is reset, and a ``crash`` row (class ``interrupted``) is logged for it.
Files outside the fence are never touched.
"""
from __future__ import annotations

from pathlib import Path

from cutile_perf import git_ops, iteration, log
from cutile_perf import session as session_mod
from cutile_perf.commands import Outcome, say
from cutile_perf.errors import Locked, Refused


def resume(*, repo: Path) -> Outcome:
    session = session_mod.load(repo)
    lock = session_mod.read_lock(session.repo)
    stale = lock is not None and session_mod.lock_is_stale(lock)
    if lock is not None and not stale:
        raise Locked(f"a cutile-perf `{lock.get('command')}` (pid {lock.get('pid')}) is still running",
                     "wait for it; resume is for runs that were killed")
    clock = iteration.Clock()
    g = git_ops.open_repo(session.repo)
    # Before the lock: a stale lock (it names the killed run's optimization) must outlive a refusal.
    iteration.require_session_branch(session, g)
    with session_mod.locked(session.repo, "resume", replace_stale=True):
        entries = log.read_entries(session.log_path)
        kept = iteration.kept_commit(session, entries)
        head = git_ops.head(g)
        if head != kept and not git_ops.is_ancestor(g, kept, head):
            raise Refused(f"HEAD {git_ops.short(g, head)} does not descend from the last kept commit "
                          f"{git_ops.short(g, kept)}", f"git checkout {session.branch}, then resume")
        touched = iteration.paths_touched(session, g, kept)
        actions: list[str] = []
        if stale:
            actions.append(f"removed the stale lock of a killed `{lock.get('command')}` (pid {lock.get('pid')})")
        interrupted = head != kept or (stale and lock.get("command") == "try")
        if not touched and head == kept:
            text = "consistent: HEAD is the last kept commit and the fenced files match it"
            return Outcome("; ".join([*actions, text]), {"actions": actions, "head": head, "consistent": True})
        if not interrupted:
            # No sign of a killed run: an uncommitted edit is the agent's next candidate, not debris.
            text = f"consistent; uncommitted change to {', '.join(touched)} is pending: run `cutile-perf try`"
            return Outcome("; ".join([*actions, text]), {"actions": actions, "head": head, "consistent": True,
                                                         "pending": touched})
        last = entries[-1] if entries else {}
        logged = head != kept and last.get("commit") == head and last.get("status") != "keep"
        number = last.get("iteration") if logged else log.next_iteration(entries)
        from_lock = (lock or {}).get("optimization")
        optimization = from_lock or (last.get("optimization") if logged else None) or "unlogged change"
        name = f"{number}-{iteration.slug(str(optimization))}"
        # Save first: a second kill during resume must still find the work on disk.
        patches = []
        if head != kept:
            patches.append(iteration.save_patch(session, g, kept, touched, f"{name}-committed", to_commit=head))
        if set(git_ops.changed_paths(g)) & set(touched):
            base = head if head != kept else kept
            patches.append(iteration.save_patch(session, g, base, touched, f"{name}-worktree"))
        patches = [p for p in patches if p]
        if not logged:
            entry = iteration.base_entry(
                session, iteration=number, optimization=str(optimization), status="crash", correctness="FAIL",
                commit=head if head != kept else None, base_commit=kept, clock=clock, crash_class="interrupted",
                patch=patches[0] if patches else None, patches=patches,
                reason="the run was killed mid-iteration; restored by resume")
            iteration.record(session, entry)
            actions.append(f"logged crash row {number} (interrupted)")
        say(f"resetting to {git_ops.short(g, kept)}")
        git_ops.reset_to(g, kept, touched)
        actions.append(f"reset to the last kept commit {git_ops.short(g, kept)}; saved: {', '.join(patches) or 'nothing'}")
    return Outcome("; ".join(actions), {"actions": actions, "head": kept, "patches": patches, "consistent": True,
                                        "iteration": number})
