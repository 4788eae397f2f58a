"""``cutile-perf env``: the environment check."""
from __future__ import annotations

from cutile_perf.child import envcheck
from cutile_perf.output import Outcome
from cutile_perf.errors import EXIT_OK, EXIT_REJECTED


def env() -> Outcome:
    result = envcheck.check()
    data = {**result.record(), "ready": result.can_measure,
            "problems": [{"what": p.what, "message": p.message, "fatal": p.fatal_for_measuring}
                         for p in result.problems]}
    # Exit 1 ("a check said not ready"): scripts can gate on it; nothing is refused or changed.
    return Outcome(envcheck.render(result), data, EXIT_OK if result.can_measure else EXIT_REJECTED)
