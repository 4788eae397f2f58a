"""``cutile-perf tileir-check``: which triton is active and whether its TileIR backend can be used."""
from __future__ import annotations

import json

from cutile_perf.output import Outcome
from cutile_perf.errors import EXIT_OK, EXIT_REJECTED
from cutile_perf.tileir import check


def tileir_check(*, strict: bool = False) -> Outcome:
    """Always JSON; exit 1 when ``"ready": false`` (the TileIR backend is not the active target), as
    the exit codes say: 1 is a check saying "not ready". ``strict`` is kept for old scripts: it was
    the only way to get that exit 1, and now changes nothing."""
    report = check.check()
    exit_code = EXIT_OK if report["ready"] else EXIT_REJECTED
    return Outcome(text=json.dumps(report, indent=2, sort_keys=True), data=report, exit_code=exit_code)
