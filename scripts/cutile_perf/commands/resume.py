"""``cutile-perf resume``: after a kill, finish the interrupted iteration the one consistent way.

``loop.iteration.resume_interrupted`` ends the killed run's children, finishes its iteration from
the step it reached (an ``interrupted`` crash row before a verdict existed, the prepared row, once,
after) and settles the branch by that row. Without a state there is nothing to finish: HEAD must
then be the last kept commit, and commits made by hand are refused by name, never reset away.
Files outside the fence are never touched.
"""
from __future__ import annotations

from pathlib import Path

from cutile_perf.loop.iteration import resume_interrupted
from cutile_perf.output import Outcome


def resume(*, repo: Path) -> Outcome:
    result = resume_interrupted(repo)
    text = "consistent: HEAD is the last kept commit"
    if result.pending:
        text += f"; uncommitted change to {', '.join(result.pending)} is pending: run `cutile-perf try`"
    return Outcome("; ".join([*result.actions, text]), {"actions": result.actions, "head": result.head,
                                                         "consistent": True, "pending": result.pending})
