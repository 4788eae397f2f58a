"""``cutile-perf resume``: after a kill, finish the interrupted iteration the one consistent way.

The iteration's persisted state (``txn``) says how far it got; ``iteration.settle_interrupted``
finishes it: an ``interrupted`` crash row before a verdict existed, the prepared row (once) after,
then the branch settled by that row. Child process groups recorded by the killed run are ended
first. Without a state there is nothing to finish: HEAD must then be the last kept commit, and
commits made by hand are refused by name, never reset away. Files outside the fence are never touched.
"""
from __future__ import annotations

from pathlib import Path

from cutile_perf.store import git_ops
from cutile_perf.loop import iteration, txn
from cutile_perf.store import session as session_mod
from cutile_perf.output import Outcome, say
from cutile_perf.judge.crash import CrashClass
from cutile_perf.errors import Locked


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
        actions: list[str] = []
        if stale:
            actions.append(f"removed the stale lock of a killed `{lock.get('command')}` (pid {lock.get('pid')})")
        state = txn.State.load(session)
        if state is not None:
            ended = txn.end_children(state.children)
            if ended:
                actions.append(f"ended {len(ended)} child process group(s) of the killed run")
            step = state.step
            say(f"finishing iteration {state.iteration} (stopped after: {step})")
            row = iteration.settle_interrupted(session, g, state, crash_class=CrashClass.INTERRUPTED.value,
                                               clock=clock, reason=f"the run was stopped after step '{step}'; "
                                               "finished by resume")
            actions.append(f"iteration {row['iteration']}: {row['status']}"
                           + (f" ({row.get('crash_class')})" if row.get("crash_class") else "")
                           + (f", change saved in {row['patch']}" if row.get("patch") else ""))
        history = iteration.open_history(session, g)
        kept = history.kept_commit(session.base_commit)
        head = git_ops.head(g)
        if head != kept:
            iteration.refuse_foreign_commits(session, g, kept, head)
        pending = iteration.paths_touched(session, g, kept)
        text = "consistent: HEAD is the last kept commit"
        if pending:
            text += f"; uncommitted change to {', '.join(pending)} is pending: run `cutile-perf try`"
    return Outcome("; ".join([*actions, text]), {"actions": actions, "head": kept, "consistent": True,
                                                 "pending": pending})
