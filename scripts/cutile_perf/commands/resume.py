"""``cutile-perf resume``: after a kill, finish the interrupted iteration the one consistent way.

``loop.iteration.resume_interrupted`` ends the killed run's children, finishes its iteration from
the step it reached (an ``interrupted`` crash row before a verdict existed, the prepared row, once,
after) and settles the branch by that row. Without a state there is nothing to finish: HEAD must
then be the last kept commit, and commits made by hand are refused by name, never reset away.
Files outside the fence are never touched.

When the last kept commit is no longer on the branch (amended, rebased, reset away), resume refuses
and names two flags; ``--adopt`` or ``--reset-to-kept`` takes one of those ways on (``loop.adopt``).
"""
from __future__ import annotations

import functools
from pathlib import Path

from cutile_perf.child import envcheck
from cutile_perf.loop import adopt
from cutile_perf.loop.guards import require_gpu
from cutile_perf.loop.iteration import resume_interrupted
from cutile_perf.output import Outcome
from cutile_perf.store import session as session_mod


def resume(*, repo: Path, adopt_head: bool = False, reset_to_kept: bool = False) -> Outcome:
    settle = None
    if adopt_head:
        probe = envcheck.Probe()
        require_gpu(session_mod.load(repo), probe)  # adopting measures: refused before anything moves
        settle = functools.partial(adopt.adopt, probe=probe)
    elif reset_to_kept:
        settle = adopt.reset_to_kept
    result = resume_interrupted(repo, settle)
    text = "consistent: HEAD is the last kept commit"
    if settle is not None and not result.settled_off_branch:
        text += " (nothing to adopt or reset: the kept commit is on the branch)"
    if result.pending:
        text += f"; uncommitted change to {', '.join(result.pending)} is pending: run `cutile-perf try`"
    return Outcome("; ".join([*result.actions, text]), {"actions": result.actions, "head": result.head,
                                                         "consistent": True, "pending": result.pending,
                                                         "settled_off_branch": result.settled_off_branch})
