"""Budgeted: a random sample, then local refinement around the best, for spaces over ~30 configs.

Round 1 evaluates the fixed config (``space[0]``) plus a seeded random sample of ``initial``
configs. Each later round evaluates the unevaluated neighbours of the current best (configs that
differ in one field, by one step of that field's sorted values; if none are left, any config that
differs in one field), until the best stops improving or ``budget`` configs have been evaluated.
Every round is one batch, so it compiles in parallel.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

from cutile_perf.tune.config import Config, Trial, best_trial

OPTIONS = {
    "budget": ("max configs to evaluate", 30),
    "initial": ("configs in the random first round, fixed config included (0: half the budget)", 0),
    "seed": ("random seed of the first round", 0),
}
PARALLEL_COMPILE = True


def _sort_key(value):
    return (type(value).__name__, value)


def neighbours(space: Sequence[Config], center: Config, *, adjacent: bool = True) -> list[Config]:
    """Configs of ``space`` that differ from ``center`` in exactly one field.

    With ``adjacent``, only by one step in the sorted values that field takes in the space.
    """
    values = {}
    for cfg in space:
        for k, v in cfg.items():
            values.setdefault(k, set()).add(v)
    order = {k: sorted(vs, key=_sort_key) for k, vs in values.items()}
    found = []
    for cfg in space:
        if set(cfg) != set(center):
            continue
        diff = [k for k in cfg if cfg[k] != center[k]]
        if len(diff) != 1:
            continue
        k = diff[0]
        if adjacent and abs(order[k].index(cfg[k]) - order[k].index(center[k])) != 1:
            continue
        found.append(cfg)
    return found


def search(space, evaluate, options):
    space = list(space)
    budget = max(1, int(options["budget"]))
    if len(space) <= budget:
        return evaluate(space)
    initial = int(options["initial"]) or max(1, budget // 2)
    initial = min(initial, budget)
    rng = random.Random(options["seed"])
    first = [space[0]] + rng.sample(space[1:], initial - 1)
    trials: dict[Config, Trial] = {t.config: t for t in evaluate(first)}
    while len(trials) < budget:
        best = best_trial(trials.values())
        if best is None:  # every sampled config failed: spend the rest of the budget randomly
            rest = [c for c in space if c not in trials]
            batch = rng.sample(rest, min(len(rest), budget - len(trials)))
        else:
            batch = [c for c in neighbours(space, best.config) if c not in trials]
            if not batch:
                batch = [c for c in neighbours(space, best.config, adjacent=False) if c not in trials]
            batch = batch[: budget - len(trials)]
        if not batch:
            break
        for t in evaluate(batch):
            trials[t.config] = t
        new_best = best_trial(trials.values())
        if best is not None and new_best is not None and new_best.score >= best.score:
            break  # no neighbour beat the best: a local optimum
    return list(trials.values())
