"""Autotuner behaviour on CPU with a fake launcher and the FakeBench timing backend."""
from __future__ import annotations


import numpy as np
import pytest
from optional_deps import needs

from cutile_perf.errors import UsageError
from cutile_perf.tune import Autotuner, Config, DeviceInfo, FakeBench, TuneFailed, shape_key
from cutile_perf.tune.config import Trial

H200 = DeviceInfo("FAKE H200", (9, 0))


class FakeKernel:
    """Stands in for a ct.kernel: records replace_hints calls."""

    def __init__(self, hints=None, log=None):
        self.hints = hints or {}
        self.log = log if log is not None else []

    def replace_hints(self, **hints):
        self.log.append(hints)
        return FakeKernel(hints, self.log)


class FakeLauncher:
    """Stands in for ct.launch: records launches and adds 1 to args[0] (an in-place kernel)."""

    def __init__(self):
        self.launches = []

    def __call__(self, stream, grid, kernel, args):
        self.launches.append((grid, kernel.hints, args))
        args[0][...] += 1


OCC = [Config(occupancy=o) for o in (1, 2, 4, 8)]


def make_tuner(tmp_path, times, **kw):
    kw.setdefault("fixed", Config(occupancy=1))
    return Autotuner(FakeKernel(), OCC, timer=FakeBench(times), precompile=None, cache_dir=tmp_path,
                     device=H200, launcher=FakeLauncher(), **kw)


def fn_pair():
    x = np.zeros(4)
    return x, (lambda cfg: (4 * cfg.occupancy,)), (lambda cfg: (x,))


def test_tune_picks_fastest_and_caches_config_and_kernel(tmp_path):
    tuner = make_tuner(tmp_path, {OCC[0]: 1.0, OCC[1]: 0.7, OCC[2]: 0.8, OCC[3]: 0.9})
    x, grid_fn, args_fn = fn_pair()
    cfg = tuner.launch(0, ("k",), grid_fn, args_fn)
    assert cfg == Config(occupancy=2)
    assert tuner.cache[("k",)].kernel.hints == {"occupancy": 2}
    hint_calls = len(tuner.kernel.log)
    tuner.launch(0, ("k",), grid_fn, args_fn)
    tuner.launch(0, ("k",), grid_fn, args_fn)
    # The hot path never calls replace_hints again and never times again.
    assert len(tuner.kernel.log) == hint_calls == 4
    assert tuner.timer.timed == OCC
    assert tuner.launcher.launches[-1][0] == (8,)


def test_fixed_config_must_be_in_space(tmp_path):
    with pytest.raises(UsageError, match="not in the search space"):
        make_tuner(tmp_path, {}, fixed=Config(occupancy=16))


def test_fixed_config_is_evaluated_first(tmp_path):
    tuner = make_tuner(tmp_path, {c: 1.0 for c in OCC}, fixed=Config(occupancy=4))
    x, grid_fn, args_fn = fn_pair()
    tuner.tune("k", 0, grid_fn, args_fn)
    assert tuner.timer.timed[0] == Config(occupancy=4)


@pytest.mark.parametrize("var", ["DISABLE_AUTOTUNE", "TILEGYM_DISABLE_AUTOTUNE"])
def test_disable_autotune_launches_fixed_without_search(tmp_path, monkeypatch, var):
    monkeypatch.setenv(var, "1")
    tuner = make_tuner(tmp_path, {c: 1.0 for c in OCC}, fixed=Config(occupancy=4))
    x, grid_fn, args_fn = fn_pair()
    assert tuner.launch(0, "k", grid_fn, args_fn) == Config(occupancy=4)
    assert tuner.timer.timed == []
    assert tuner.reports["k"].source == "disabled"
    assert len(tuner.launcher.launches) == 1
    assert not list(tmp_path.iterdir())  # nothing persisted: it was not a tuning result


def test_split_buffer_search_never_touches_the_real_input(tmp_path):
    tuner = make_tuner(tmp_path, {c: 1.0 for c in OCC})
    x = np.zeros(4)
    tuner.launch(0, "k", lambda cfg: (1,), lambda cfg: (x,), inplace=(0,))
    # Four search launches went to the scratch copy; the real tensor saw only the final launch.
    assert len(tuner.launcher.launches) == 5
    np.testing.assert_array_equal(x, np.ones(4))
    scratch = tuner.launcher.launches[0][2][0]
    assert scratch is not x
    np.testing.assert_array_equal(scratch, np.full(4, 4.0))


def test_without_split_buffer_the_search_corrupts_an_inplace_input(tmp_path):
    # The failure split-buffer prevents (TileGym pitfall #1), shown with the same fakes.
    tuner = make_tuner(tmp_path, {c: 1.0 for c in OCC})
    x = np.zeros(4)
    tuner.launch(0, "k", lambda cfg: (1,), lambda cfg: (x,))
    np.testing.assert_array_equal(x, np.full(4, 5.0))


def test_failed_configs_lose_and_do_not_abort(tmp_path):
    tuner = make_tuner(tmp_path, {OCC[0]: 1.0, OCC[2]: 0.5})  # occ 2 and 8 have no time: launch failures
    x, grid_fn, args_fn = fn_pair()
    tuner.tune("k", 0, grid_fn, args_fn)
    trials = {t.config: t for t in tuner.reports["k"].trials}
    assert tuner.cache["k"].config == Config(occupancy=4)
    assert trials[Config(occupancy=2)].error == "launch"


def test_compile_failures_from_the_precompile_stage_are_trials(tmp_path):
    from cutile_perf.tune.precompile import CompileOutcome

    def fake_precompile(kernel, items, sm_arch, on_done=None):
        assert sm_arch == "sm_90"
        return {cfg: CompileOutcome(cfg, "compile" if cfg.occupancy == 2 else "ok", 0.1, "tileiras: boom")
                for cfg, _ in items}

    tuner = Autotuner(FakeKernel(), OCC, fixed=OCC[0], timer=FakeBench({c: 1.0 / c.occupancy for c in OCC}),
                      precompile=fake_precompile, cache_dir=tmp_path, device=H200, launcher=FakeLauncher())
    x, grid_fn, args_fn = fn_pair()
    tuner.tune("k", 0, grid_fn, args_fn)
    report = tuner.reports["k"]
    failed = [t for t in report.trials if t.error]
    assert failed == [Trial(Config(occupancy=2), None, "compile", "tileiras: boom", 0.1)]
    assert Config(occupancy=2) not in tuner.timer.timed  # a config that failed to compile is never launched
    assert report.compiled == 3 and tuner.cache["k"].config == Config(occupancy=8)


def test_compiled_configs_are_loaded_while_the_others_still_compile(tmp_path):
    """Pipelined stage 1: each config is launched once (JIT load) as soon as its compile is done."""
    from cutile_perf.tune.precompile import CompileOutcome

    launcher = FakeLauncher()
    loaded_during_precompile = []

    def fake_precompile(kernel, items, sm_arch, on_done=None):
        outcomes = {}
        for cfg, _ in items:
            outcomes[cfg] = CompileOutcome(cfg, "ok", 0.1)
            before = len(launcher.launches)
            on_done(outcomes[cfg])
            loaded_during_precompile.extend(h["occupancy"] for _, h, _ in launcher.launches[before:])
        return outcomes

    def launch_or_fail(stream, grid, kernel, args):
        if kernel.hints.get("occupancy") == 4:
            raise RuntimeError("launch failed: out of resources")
        launcher(stream, grid, kernel, args)

    tuner = Autotuner(FakeKernel(), OCC, fixed=OCC[0], timer=FakeBench({c: 1.0 / c.occupancy for c in OCC}),
                      precompile=fake_precompile, cache_dir=tmp_path, device=H200, launcher=launch_or_fail)
    x, grid_fn, args_fn = fn_pair()
    tuner.tune("k", 0, grid_fn, args_fn)
    report = tuner.reports["k"]
    assert loaded_during_precompile == [1, 2, 8]  # every config but the one whose load failed
    failed = {t.config: t.error for t in report.trials if t.error}
    assert failed == {Config(occupancy=4): "launch"}
    assert Config(occupancy=4) not in tuner.timer.timed  # a config that failed to load is never timed
    assert tuner.cache["k"].config == Config(occupancy=8)
    assert report.load_s >= 0 and (report.compiler, report.handoffs) == ("custom", 0)


def test_all_failed_raises_tune_failed(tmp_path):
    tuner = make_tuner(tmp_path, {})
    x, grid_fn, args_fn = fn_pair()
    with pytest.raises(TuneFailed, match="every config"):
        tuner.tune("k", 0, grid_fn, args_fn)


def test_shape_key_is_cheap_tuple_of_shapes_dtypes_device():
    a, b = np.zeros((2, 3), np.float16), np.zeros(3, np.float32)
    key = shape_key(a, b, extra=(1e-6,))
    assert key[:4] == ((2, 3), np.dtype(np.float16), (3,), np.dtype(np.float32))
    assert key[-1] == 1e-6
    assert hash(key) == hash(shape_key(a.copy(), b.copy(), extra=(1e-6,)))


# --- the probe cut before exhaustive_search (CuTileTimer) ----------------------------------------


def _probe_candidates(seconds_by_occupancy: dict[int, float], launches: list[int]):
    """Candidates whose launch advances a FAKE clock by a scripted time (no GPU, no sleeping)."""
    from cutile_perf.tune.timing import Candidate

    clock = {"now": 0.0}

    def launcher(occupancy):
        def launch(_stream, _grid, _kernel, _args):
            launches.append(occupancy)
            if seconds_by_occupancy[occupancy] is None:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            clock["now"] += seconds_by_occupancy[occupancy]
        return launch

    cands = [Candidate(Config(occupancy=o), None, (1,), (), 0, launcher(o)) for o in seconds_by_occupancy]
    return cands, (lambda: clock["now"])


def test_probe_cut_drops_only_configs_that_lost_by_more_than_the_cut():
    from cutile_perf.tune.timing import probe_cut

    launches: list[int] = []
    cands, clock = _probe_candidates({1: 1.0e-3, 2: 1.4e-3, 4: 1.6e-3, 8: 12e-3, 16: None}, launches)
    survivors, trials = probe_cut(cands, 1.5, repeats=2, clock=clock)
    assert [c.config.occupancy for c in survivors] == [1, 2]  # 1.4 ms is within 1.5 x 1.0 ms
    by_occ = {t.config.occupancy: t for t in trials}
    assert by_occ[4].error == by_occ[8].error == "pruned" and "1.5 x the fastest probe 1.000 ms" in by_occ[8].detail
    assert by_occ[16].error == "launch" and not by_occ[16].ok  # a probe failure is a launch failure
    assert launches.count(8) == 2  # two probe launches, then no more for a loser


@needs("cuda.tile")
def test_cutile_timer_sends_only_the_probe_survivors_to_exhaustive_search(monkeypatch):
    """exhaustive_search (faked: it needs a GPU) sees the survivors; the losers come back pruned."""
    import cuda.tile.tune as cttune

    from cutile_perf.tune import timing

    launches: list[int] = []
    cands, clock = _probe_candidates({1: 2.0e-3, 2: 1.0e-3, 4: 30e-3}, launches)
    real = timing.probe_cut
    monkeypatch.setattr(timing, "probe_cut", lambda c, cut: real(c, cut, clock=clock))
    seen = {}

    class Result:
        successes = ()
        failures = ()

    def fake_search(space, stream, **kw):
        seen["space"] = list(space)
        return Result()

    monkeypatch.setattr(cttune, "exhaustive_search", fake_search)
    trials = timing.CuTileTimer(cut=1.5)(cands)
    assert [c.occupancy for c in seen["space"]] == [2]  # 2 ms is beyond 1.5 x 1 ms
    assert sorted((t.config.occupancy, t.error) for t in trials) == [(1, "pruned"), (4, "pruned")]
    seen.clear()
    timing.CuTileTimer(cut=None)(cands)  # probe, ab and prune time every config
    assert [c.occupancy for c in seen["space"]] == [1, 2, 4]
