"""Search strategies: plug-in modules registered in one dict (house style 7).

Each module exports ``OPTIONS = {name: (help, default)}``, ``PARALLEL_COMPILE`` (True when it
hands ``evaluate`` whole batches, so the batch compiles in parallel) and
``search(space, evaluate, options) -> list[Trial]``. ``space[0]`` is the designated fixed config;
every strategy evaluates it, so tuning never picks something worse than the fixed launch
without having measured it.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from cutile_perf.errors import UsageError
from cutile_perf.tune.strategies import exhaustive, sample_refine, surrogate

STRATEGIES: dict[str, ModuleType] = {
    "exhaustive": exhaustive,
    "sample_refine": sample_refine,
    "surrogate": surrogate,
}


def get_strategy(name: str) -> ModuleType:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UsageError(f"unknown search strategy {name!r}; available: {', '.join(sorted(STRATEGIES))}") from None


def resolve_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults of strategy ``name`` updated with ``options``; an unknown option is an error."""
    module = get_strategy(name)
    allowed = module.OPTIONS
    unknown = sorted(set(options or {}) - set(allowed))
    if unknown:
        listing = ", ".join(f"{k} ({help_}; default {default})" for k, (help_, default) in sorted(allowed.items())) or "none"
        raise UsageError(f"strategy {name!r} has no option {', '.join(unknown)}; allowed: {listing}")
    resolved = {k: default for k, (_, default) in allowed.items()}
    resolved.update(options or {})
    return resolved
