"""What a command reports (``Outcome``) and progress for people (``say``): the bottom layer every
other layer may use, so that no library module imports ``commands`` to talk."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from cutile_perf.errors import EXIT_OK


@dataclass(frozen=True)
class Outcome:
    """What a command reports: an exit code, one stable line for people, and data for ``--json``."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)
    exit_code: int = EXIT_OK


def say(message: str) -> None:
    """Progress for people watching; stderr, so stdout stays one parseable result."""
    print(f"cutile-perf: {message}", file=sys.stderr, flush=True)
