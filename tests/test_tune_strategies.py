"""Search strategies with scripted timings (no GPU): registry, options, budgets, refinement."""
from __future__ import annotations

import itertools

import pytest

from cutile_perf.errors import UsageError
from cutile_perf.tune.config import Config, Trial, best_trial
from cutile_perf.tune.strategies import STRATEGIES, get_strategy, resolve_options
from cutile_perf.tune.strategies.sample_refine import neighbours


def scripted_evaluate(score):
    calls = []

    def evaluate(configs):
        calls.append(list(configs))
        return [Trial(c, (score(c),)) for c in configs]

    return evaluate, calls


# A 125-config matmul-like space with one smooth optimum at 128x128x64.
SPACE = [Config(TILE_M=m, TILE_N=n, TILE_K=k) for m, n, k in itertools.product(
    (16, 32, 64, 128, 256), (16, 32, 64, 128, 256), (16, 32, 64, 128, 256))]


def bowl(c):
    import math

    return 1.0 + sum(abs(math.log2(v) - math.log2(t)) for v, t in ((c.TILE_M, 128), (c.TILE_N, 128), (c.TILE_K, 64)))


def test_registry_holds_the_modules_and_their_options():
    assert set(STRATEGIES) == {"exhaustive", "sample_refine", "surrogate"}
    assert resolve_options("sample_refine", None)["budget"] == 30
    assert all(m.PARALLEL_COMPILE for m in STRATEGIES.values())


def test_unknown_strategy_and_option_list_what_is_allowed():
    with pytest.raises(UsageError, match="available: exhaustive, sample_refine, surrogate"):
        get_strategy("bayes")
    with pytest.raises(UsageError, match=r"no option budgte; allowed: budget \(max configs"):
        resolve_options("sample_refine", {"budgte": 3})
    with pytest.raises(UsageError, match="allowed: none"):
        resolve_options("exhaustive", {"budget": 3})


def test_exhaustive_evaluates_everything_in_one_batch():
    evaluate, calls = scripted_evaluate(bowl)
    trials = get_strategy("exhaustive").search(SPACE, evaluate, {})
    assert len(calls) == 1 and len(trials) == len(SPACE)
    assert best_trial(trials).config == Config(TILE_M=128, TILE_N=128, TILE_K=64)


def test_sample_refine_respects_budget_and_finds_the_bowl_optimum():
    evaluate, calls = scripted_evaluate(bowl)
    options = resolve_options("sample_refine", {"budget": 30, "seed": 1})
    trials = get_strategy("sample_refine").search(SPACE, evaluate, options)
    evaluated = [c for batch in calls for c in batch]
    assert len(evaluated) == len(set(evaluated)) == len(trials) <= 30
    assert evaluated[0] == SPACE[0]  # the fixed config is always in the first batch
    assert len(calls) >= 2  # a random round, then refinement rounds, each a parallel batch
    assert best_trial(trials).config == Config(TILE_M=128, TILE_N=128, TILE_K=64)


def test_sample_refine_is_exhaustive_when_the_space_fits_the_budget():
    evaluate, calls = scripted_evaluate(bowl)
    get_strategy("sample_refine").search(SPACE[:10], evaluate, resolve_options("sample_refine", {}))
    assert calls == [SPACE[:10]]


def test_sample_refine_survives_an_all_failed_first_round():
    def evaluate(configs):
        return [Trial(c, None, "compile", "x") if c.TILE_M < 256 else Trial(c, (1.0,)) for c in configs]

    trials = get_strategy("sample_refine").search(SPACE, evaluate, resolve_options("sample_refine", {"budget": 60, "initial": 2}))
    assert len(trials) <= 60


def test_neighbours_differ_in_one_field_by_one_step():
    center = Config(TILE_M=64, TILE_N=64, TILE_K=64)
    found = neighbours(SPACE, center)
    assert len(found) == 6
    assert Config(TILE_M=128, TILE_N=64, TILE_K=64) in found
    assert Config(TILE_M=256, TILE_N=64, TILE_K=64) not in found
    assert len(neighbours(SPACE, center, adjacent=False)) == 12
