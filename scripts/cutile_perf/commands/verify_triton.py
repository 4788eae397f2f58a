"""``cutile-perf verify-triton``: a Triton kernel's entry point against a torch reference, per shape,
with ENABLE_TILE=0 and (where the backend exists) ENABLE_TILE=1."""
from __future__ import annotations

import json
from pathlib import Path

from cutile_perf.output import Outcome
from cutile_perf.errors import EXIT_OK, EXIT_REFUSED, EXIT_REJECTED
from cutile_perf.tileir import verify


def verify_triton(*, kernel: Path, reference: str, shapes: str, dtypes: str | None, entry: str | None,
                  device: str, tileir: bool, atol: float | None, rtol: float | None, seed: int,
                  timeout_s: float) -> Outcome:
    """Exit 0 when every pass that ran passed, 1 when one failed, 3 when nothing could run here."""
    result = verify.verify(kernel, reference, shapes, dtypes, entry=entry, device=device, tileir=tileir,
                           atol=atol, rtol=rtol, seed=seed, timeout_s=timeout_s)
    exit_code = EXIT_REFUSED if not result["ran"] else EXIT_OK if result["passed"] else EXIT_REJECTED
    return Outcome(text=json.dumps(result, indent=2), data=result, exit_code=exit_code)
