"""Real tuning of real kernels on the GPU (skipped without one).

What each test proves:
* stage 1 runs every tileiras in its compile threads (none in the caller's thread, none in the
  timing stage), and each config's first launch takes the handed-off cubin (no second frontend);
  exhaustive_search then times those loaded kernels (no frontend outside stage 1 at all);
* a second tuner (a new process, in effect) loads the persisted answer: nothing compiled or timed;
* split-buffer tuning of an in-place kernel leaves the input incremented exactly once;
* code generated from templates/autotune runs for real.
"""
from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def fresh_tile_cache(tmp_path, monkeypatch):
    from cuda.tile._cext import default_tile_context

    from cutile_perf.tune.precompile import shutdown_pool

    monkeypatch.setattr(default_tile_context.config, "cache_dir", str(tmp_path / "tile-cache"))
    yield tmp_path
    shutdown_pool()


@pytest.fixture
def tileiras_runs(monkeypatch):
    import cuda.tile._compile as compile_mod

    import threading

    runs = []  # the name of the thread that ran each tileiras
    real = compile_mod.compile_cubin
    monkeypatch.setattr(compile_mod, "compile_cubin",
                        lambda *a, **k: (runs.append(threading.current_thread().name), real(*a, **k))[1])
    return runs


@pytest.fixture
def frontend_runs(monkeypatch):
    import cuda.tile._compile as compile_mod

    import threading

    runs = []  # the name of the thread that ran each compile_tile (cuTile's frontend)
    real = compile_mod.compile_tile
    monkeypatch.setattr(compile_mod, "compile_tile",
                        lambda *a, **k: (runs.append(threading.current_thread().name), real(*a, **k))[1])
    return runs


def _matmul_problem(n=1024):
    import torch

    a = torch.randn(n, n, dtype=torch.float16, device="cuda")
    b = torch.randn(n, n, dtype=torch.float16, device="cuda")
    c = torch.empty(n, n, dtype=torch.float16, device="cuda")
    grid_fn = lambda cfg: (n // cfg.TILE_M, n // cfg.TILE_N, 1)  # noqa: E731
    args_fn = lambda cfg: (a, b, c, cfg.TILE_M, cfg.TILE_N, cfg.TILE_K)  # noqa: E731
    return a, b, c, grid_fn, args_fn



def _space():
    from cutile_perf.tune import Config

    return [Config(TILE_M=m, TILE_N=n, TILE_K=k, occupancy=o) for m, n, k, o in
            [(64, 64, 32, 1), (128, 128, 64, 1), (128, 64, 64, 2), (64, 128, 32, 2)]]


def test_precompiled_candidates_are_cache_hits_in_the_timing_stage(fresh_tile_cache, tileiras_runs, frontend_runs):
    import torch

    from cutile_perf.tune import Autotuner
    from tests.tune_kernels import matmul_kernel

    a, b, c, grid_fn, args_fn = _matmul_problem()
    space = _space()
    tuner = Autotuner(matmul_kernel, space, fixed=space[0], persistent=False)
    tuned = tuner.tune("k", torch.cuda.current_stream(), grid_fn, args_fn)
    report = tuner.reports["k"]
    assert report.compiled == len(space), report
    assert report.compiler == "threads"  # no pool was running: nothing to start
    assert len(tileiras_runs) == len(space)
    assert all(name.startswith("cutile-perf-compile") for name in tileiras_runs), tileiras_runs
    assert report.handoffs == len(space), report  # first launches took stage 1's cubins
    tuner.launch(torch.cuda.current_stream(), "k", grid_fn, args_fn)
    # One frontend per config, all in stage 1: exhaustive_search's replace_hints() kept the loaded
    # kernels (no second compile in the timing stage or at the final launch).
    assert len(frontend_runs) == len(space), frontend_runs
    assert all(name.startswith("cutile-perf-compile") for name in frontend_runs), frontend_runs
    torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1)
    assert tuned.config in space


def test_second_tuner_uses_the_persistent_cache(fresh_tile_cache, tileiras_runs):
    import torch

    from cutile_perf.tune import Autotuner
    from tests.tune_kernels import matmul_kernel

    a, b, c, grid_fn, args_fn = _matmul_problem()
    space = _space()
    first = Autotuner(matmul_kernel, space, fixed=space[0], cache_dir=fresh_tile_cache / "tune")
    winner = first.tune("k", torch.cuda.current_stream(), grid_fn, args_fn).config
    second = Autotuner(matmul_kernel, space, fixed=space[0], cache_dir=fresh_tile_cache / "tune")
    assert second.tune("k", torch.cuda.current_stream(), grid_fn, args_fn).config == winner
    assert (second.reports["k"].source, second.reports["k"].compiled, second.reports["k"].timed) == ("disk", 0, 0)


def test_split_buffer_keeps_the_inplace_input(fresh_tile_cache):
    import torch

    from cutile_perf.tune import Autotuner, Config
    from tests.tune_kernels import add_one_kernel

    x = torch.arange(1 << 16, dtype=torch.float32, device="cuda")
    expected = x + 1
    space = [Config(TILE=1024, occupancy=o) for o in (1, 2, 4, 8)]
    tuner = Autotuner(add_one_kernel, space, fixed=space[0], persistent=False)
    tuner.launch(torch.cuda.current_stream(), "k", lambda cfg: (x.numel() // cfg.TILE,),
                 lambda cfg: (x, cfg.TILE), inplace=(0,))
    torch.cuda.synchronize()
    torch.testing.assert_close(x, expected, rtol=0, atol=0)


def test_generated_template_runs_for_real(tmp_path, fresh_tile_cache):
    import torch

    from cutile_perf.tune.codegen import render

    src = render("split_buffer", op_name="add_one", kernel_module="tests.tune_kernels", kernel_name="add_one_kernel",
                 params=["x"], grid="(x.numel() // 1024,)", args="(x, 1024)", key="(tuple(x.shape), x.dtype)",
                 configs=[{"occupancy": o} for o in (1, 2, 4)], fixed={"occupancy": 1}, inplace=["x"])
    path = tmp_path / "generated_add_one.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("generated_add_one", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.zeros(1 << 16, device="cuda")
    cfg = mod.add_one_launch(torch.cuda.current_stream().cuda_stream, x)
    mod.add_one_launch(torch.cuda.current_stream().cuda_stream, x)
    torch.cuda.synchronize()
    assert cfg.occupancy in (1, 2, 4)
    torch.testing.assert_close(x, torch.full_like(x, 2.0), rtol=0, atol=0)
