"""Every config, in one batch: all compile in parallel, then all are timed.

Use it for the final space (<= ~30 configs, ideally <= 8 per arch).
"""
from __future__ import annotations

OPTIONS: dict = {}
PARALLEL_COMPILE = True


def search(space, evaluate, options):
    return evaluate(list(space))
