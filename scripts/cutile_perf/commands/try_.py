"""``cutile-perf try "<optimization>"``: one change, committed first, measured exactly as committed.

The transaction is ``loop.iteration``'s; this command checks its argument and reports the row.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cutile_perf.errors import UsageError
from cutile_perf.loop.budget import Budget
from cutile_perf.loop.iteration import try_change
from cutile_perf.loop.row import try_outcome
from cutile_perf.output import Outcome


def try_(*, repo: Path, optimization: str, job_s: float | None = None) -> Outcome:
    optimization = " ".join(optimization.split())
    if not optimization:
        raise UsageError("the optimization description is empty", 'e.g. cutile-perf try "occupancy 2 -> 4"')
    budget = Budget.for_job(None, job_s) if job_s is not None else None
    result = try_change(repo, optimization, budget=budget)
    outcome = try_outcome(result.row, result.stop)
    if result.cut and result.row.get("patch"):
        again = f"; to try it again in the next job: git apply {result.row['patch']}, then the same command"
        return replace(outcome, text=outcome.text + again)
    return outcome
