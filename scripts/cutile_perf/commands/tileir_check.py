"""``cutile-perf tileir-check``: which triton is active and whether its TileIR backend can be used."""
from __future__ import annotations

import json

from cutile_perf.output import Outcome
from cutile_perf.errors import EXIT_OK, EXIT_REJECTED
from cutile_perf.tileir import check


def tileir_check(*, strict: bool) -> Outcome:
    """Always JSON and exit 0; with ``strict``, exit 1 when the TileIR backend is not the active target."""
    report = check.check()
    exit_code = EXIT_REJECTED if strict and not report["ready"] else EXIT_OK
    return Outcome(text=json.dumps(report, indent=2, sort_keys=True), data=report, exit_code=exit_code)
