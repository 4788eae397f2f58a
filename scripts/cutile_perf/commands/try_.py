"""``cutile-perf try "<optimization>"``: one change, committed first, measured exactly as committed.

The transaction is ``loop.iteration``'s; this command checks its argument and reports the row.
"""
from __future__ import annotations

from pathlib import Path

from cutile_perf.errors import UsageError
from cutile_perf.loop.iteration import try_change, try_outcome
from cutile_perf.output import Outcome


def try_(*, repo: Path, optimization: str) -> Outcome:
    optimization = " ".join(optimization.split())
    if not optimization:
        raise UsageError("the optimization description is empty", 'e.g. cutile-perf try "occupancy 2 -> 4"')
    result = try_change(repo, optimization)
    return try_outcome(result.row, result.stop)
