"""The model-based strategy (``surrogate``) and legality pruning, against fake timings with a known optimum.

Two scripted landscapes over a 256-config matmul space (224 after legality pruning on sm_90):
``bowl`` is smooth in log2 of each tile size with the measured H200 shape (128x128x64 best,
``num_ctas=2`` only helps large tiles); ``two_basins`` adds a broad basin 8 % above the optimum
around the fixed config, where a local search started from the fixed config gets stuck.
"""
from __future__ import annotations

import hashlib
import itertools
import math
import random

import pytest

from cutile_perf.tune import Autotuner, Config, DeviceInfo, FakeBench
from cutile_perf.tune.config import Trial, best_trial
from cutile_perf.tune.legality import problems, prune
from cutile_perf.tune.strategies import get_strategy, resolve_options

pytest.importorskip("numpy")

RAW = [Config(TILE_M=m, TILE_N=n, TILE_K=k, occupancy=o, num_ctas=c) for m, n, k, o, c in itertools.product(
    (32, 64, 128, 256), (32, 64, 128, 256), (16, 32, 64, 128), (1, 2), (1, 2))]
FIXED = Config(TILE_M=64, TILE_N=64, TILE_K=32, occupancy=1, num_ctas=1)
DIMS = {"TILE_M": 4096, "TILE_N": 4096, "TILE_K": 4096}
LEGAL, _ = prune(RAW, arch="sm_90", dims=DIMS, keep=[FIXED])
SPACE = [FIXED] + [c for c in LEGAL if c != FIXED]
OPTIMUM = Config(TILE_M=128, TILE_N=128, TILE_K=64, occupancy=1, num_ctas=1)


def _jitter(c, amp=0.01):
    """A fixed +-1 % per config, so that no two configs tie exactly."""
    h = int(hashlib.sha256(repr(c).encode()).hexdigest()[:8], 16) / 2**32
    return 1 + amp * (2 * h - 1)


def _logs(c):
    return math.log2(c.TILE_M), math.log2(c.TILE_N), math.log2(c.TILE_K)


def bowl(c):
    lm, ln, lk = _logs(c)
    per_cta = c.TILE_M * c.TILE_N / c.num_ctas
    lt = 0.35 * (lm - 7) ** 2 + 0.35 * (ln - 7) ** 2 + 0.15 * (lk - 6) ** 2 + 0.05 * (lm - ln) ** 2
    lt += (0.25 if per_cta < 8192 else 0.02) if c.num_ctas == 2 else 0.0
    lt += (0.03 if per_cta >= 16384 else -0.01) if c.occupancy == 2 else 0.0
    return math.exp(lt) * _jitter(c)


def two_basins(c):
    lm, ln, lk = _logs(c)
    narrow = 0.35 * ((lm - 7) ** 2 + (ln - 7) ** 2 + (lk - 6) ** 2) + 0.3 * (c.num_ctas == 2) + 0.05 * (c.occupancy == 2)
    broad = math.log(1.08) + 0.15 * ((lm - 6) ** 2 + (ln - 6) ** 2 + (lk - 5) ** 2) + 0.02 * (c.occupancy == 1) \
        + 0.1 * (c.num_ctas == 2)
    return math.exp(min(narrow, broad)) * _jitter(c)


def _search(name, score, **options):
    batches = []

    def evaluate(configs):
        batches.append(list(configs))
        return [Trial(c, (score(c),)) for c in configs]

    trials = get_strategy(name).search(SPACE, evaluate, resolve_options(name, options))
    return trials, batches


def _gap(trials, score):
    return best_trial(trials).score / min(score(c) for c in SPACE) - 1


def test_space_is_large_and_the_known_optimum_is_legal():
    assert len(RAW) == 256 and len(SPACE) == 224 >= 200
    assert OPTIMUM in SPACE and min(SPACE, key=bowl) == OPTIMUM == min(SPACE, key=two_basins)


@pytest.mark.parametrize("landscape", [bowl, two_basins], ids=["bowl", "two_basins"])
def test_surrogate_finds_within_2pct_using_at_most_30pct_of_the_evaluations(landscape):
    for seed in range(6):
        trials, batches = _search("surrogate", landscape, seed=seed)
        evaluated = [c for b in batches for c in b]
        assert len(evaluated) == len(set(evaluated)) == len(trials) <= 0.30 * len(SPACE)
        assert evaluated[0] == FIXED  # the fixed config is always measured
        assert _gap(trials, landscape) <= 0.02, (seed, best_trial(trials).config)


def test_the_landscapes_are_not_trivial():
    # Controls, so that the test above measures a search: with the same budget (56 of 224), random
    # sampling misses the 2 % band on most seeds, and the local search (sample_refine) started at
    # the fixed config stays in the wrong basin of two_basins on most seeds.
    random_hits = 0
    for seed in range(10):
        pick = [FIXED] + random.Random(seed).sample(SPACE[1:], 55)
        random_hits += min(bowl(c) for c in pick) / bowl(OPTIMUM) - 1 <= 0.02
    assert random_hits <= 3
    local_hits = sum(_gap(_search("sample_refine", two_basins, budget=56, seed=s)[0], two_basins) <= 0.02
                     for s in range(10))
    assert local_hits <= 4


def test_surrogate_batches_are_parallel_and_within_budget():
    trials, batches = _search("surrogate", bowl, budget=40, batch=8, initial=16)
    assert len(batches[0]) == 16 and all(len(b) <= 8 for b in batches[1:])
    assert sum(map(len, batches)) == len(trials) == 40


def test_surrogate_survives_failed_configs():
    # Every config with num_ctas=2 fails to compile: they lose, the search goes on elsewhere.
    def evaluate(configs):
        return [Trial(c, None, "compile", "x") if c.num_ctas == 2 else Trial(c, (bowl(c),)) for c in configs]

    trials = get_strategy("surrogate").search(SPACE, evaluate, resolve_options("surrogate", {}))
    assert best_trial(trials).config == OPTIMUM


def test_surrogate_is_exhaustive_when_the_budget_covers_the_space():
    trials, batches = _search("surrogate", bowl, budget=len(SPACE))
    assert batches == [SPACE]


def test_surrogate_through_the_autotuner_with_fake_timing(tmp_path):
    class Kernel:
        def replace_hints(self, **hints):
            return self

    bench = FakeBench(two_basins)
    tuner = Autotuner(Kernel(), SPACE, fixed=FIXED, strategy="surrogate", timer=bench, precompile=None,
                      cache_dir=tmp_path, device=DeviceInfo("FAKE H200", (9, 0)), launcher=lambda *a: None)
    tuned = tuner.tune("k", 0, lambda cfg: (1,), lambda cfg: ())
    assert tuned.config == OPTIMUM
    assert tuner.reports["k"].timed == len(bench.timed) == math.ceil(len(SPACE) / 4)


def test_legality_reasons():
    def why(**kw):
        return problems(Config(kw), arch="sm_90", dims=DIMS)

    assert why(TILE_M=128, TILE_N=128, TILE_K=64, num_ctas=1) == []
    assert "not a power of 2" in why(TILE_M=48, TILE_N=128, TILE_K=64)[0]
    assert "spills" in why(TILE_M=256, TILE_N=128, TILE_K=64, num_ctas=1)[0]
    assert why(TILE_M=256, TILE_N=128, TILE_K=64, num_ctas=2) == []  # split over two CTAs: measured fine
    assert "shared memory" in " ".join(why(TILE_M=256, TILE_N=256, TILE_K=128, num_ctas=4))
    assert "padding only" in problems(Config(TILE_M=256), arch="sm_90", dims={"TILE_M": 100})[0]
    assert problems(Config(TILE_M=64), arch="sm_90", dims={"TILE_M": 100}) == []
    assert "does not divide" in problems(Config(TILE_M=64), arch="sm_90", dims={"TILE_M": 100}, divisible=True)[0]
    # The register rule is measured on sm_90 only; no rule elsewhere, and none with more worker warps.
    assert problems(Config(TILE_M=256, TILE_N=256, TILE_K=32), arch="sm_100") == []
    assert problems(Config(TILE_M=256, TILE_N=128, TILE_K=32, num_worker_warps=8), arch="sm_90") == []
    assert "clusters" in problems(Config(TILE_M=64, num_ctas=2), arch="sm_80")[0]


def test_prune_never_drops_the_kept_config_and_keeps_order():
    bad = Config(TILE_M=256, TILE_N=256, TILE_K=64, num_ctas=1)
    kept, dropped = prune([bad, FIXED, OPTIMUM], arch="sm_90", keep=[bad])
    assert kept == [bad, FIXED, OPTIMUM] and dropped == []
    kept, dropped = prune([bad, FIXED, OPTIMUM], arch="sm_90")
    assert kept == [FIXED, OPTIMUM] and [d.config for d in dropped] == [bad]
