"""Stage 1 in threads (no pool start) and the cubin handoff, with the real toolchain (no GPU).

The signature is written by hand (``from_kernel_args`` needs libcuda); the JIT's miss path is
called directly as ``kernel._compile(signature, context, cc)``, the method ``ct.launch`` calls.
"""
from __future__ import annotations

import threading
import time

import pytest

from cutile_perf.tune.config import Config
from tests.test_tune_precompile import _entries, _signature

pytestmark = pytest.mark.toolchain


@pytest.fixture
def tile_cache(tmp_path, monkeypatch):
    from cuda.tile._cext import default_tile_context

    monkeypatch.setattr(default_tile_context.config, "cache_dir", str(tmp_path))
    return tmp_path


def test_threads_fill_the_disk_cache_and_overlap_tileiras(tile_cache, monkeypatch):
    import cuda.tile._compile as compile_mod
    from cuda.tile._cext import default_tile_context

    from cutile_perf.tune import threadcompile
    from tests.tune_kernels import matmul_kernel

    threadcompile._install_unlocked_tileiras()
    inner = compile_mod.compile_cubin.__wrapped__
    runs, active, peak = [], [0], [0]
    guard = threading.Lock()

    def slow_counted(*a, **k):
        with guard:
            runs.append(threading.current_thread().name)
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.3)  # widen the window: two tileiras runs in flight at once prove the overlap
            return inner(*a, **k)
        finally:
            with guard:
                active[0] -= 1

    # The wrapper calls the original it captured; swap what it captured for the counting one.
    cell = next(c for c in compile_mod.compile_cubin.__closure__ if c.cell_contents is inner)
    monkeypatch.setattr(cell, "cell_contents", slow_counted)

    configs = [Config(TM=64, occupancy=2), Config(TM=128, occupancy=1), Config(TM=64, occupancy=3)]
    jobs = [(c, [_signature(c.TM)]) for c in configs]
    reported = []
    outcomes = threadcompile.run_threads(matmul_kernel, jobs, "sm_90", workers=3, timeout_s=120.0,
                                         on_done=reported.append)
    assert {o.status for o in outcomes.values()} == {"ok"}, outcomes
    assert len(reported) == 3 and _entries(tile_cache) == 3
    assert len(runs) == 3 and all(name.startswith("cutile-perf-compile") for name in runs)
    assert peak[0] >= 2  # cuTile's lock was released around tileiras: runs overlapped
    assert default_tile_context.config.compiler_timeout_sec is None  # the batch timeout was restored

    # The JIT's own miss path now hits the disk cache: no tileiras run.
    runs.clear()
    for c in configs:
        matmul_kernel.replace_hints(**c.hints())._compile(_signature(c.TM), default_tile_context, (9, 0))
    assert runs == []


def test_a_compile_error_is_a_per_config_result_and_releases_the_lock(tile_cache):
    import cuda.tile._compile as compile_mod

    from cutile_perf.tune import threadcompile
    from tests.tune_kernels import broken_kernel, matmul_kernel

    good = threadcompile.run_threads(matmul_kernel, [(Config(TM=64), [_signature(64)])], "sm_90", workers=2,
                                     timeout_s=120.0)
    bad = threadcompile.run_threads(broken_kernel, [(Config(TM=32), [_signature(32)])], "sm_90", workers=2,
                                    timeout_s=120.0)
    assert good[Config(TM=64)].status == "ok"
    assert bad[Config(TM=32)].status == "compile" and bad[Config(TM=32)].detail
    # The lock is free again (a leaked hold would deadlock the next compile in any thread).
    assert compile_mod._compiler_lock.acquire(timeout=1)
    compile_mod._compiler_lock.release()


def test_handoff_answers_the_jit_without_frontend_or_tileiras(tile_cache, monkeypatch):
    import cuda.tile._compile as compile_mod
    from cuda.tile._cext import default_tile_context

    from cutile_perf.tune import handoff, threadcompile
    from tests.tune_kernels import matmul_kernel

    cfg = Config(TM=128, occupancy=2)
    out = threadcompile.run_threads(matmul_kernel, [(cfg, [_signature(128)])], "sm_90", workers=1, timeout_s=120.0)
    [h] = out[cfg].handoffs
    assert h.cubin and h.symbol

    kernel = handoff.hinted_kernel(matmul_kernel, cfg.hints())
    assert kernel._compiler_options.occupancy == 2
    assert handoff.give(kernel, out[cfg].handoffs, "sm_90") == 1
    calls = []
    monkeypatch.setattr(compile_mod, "compile_tile", lambda *a, **k: calls.append(a))
    # The JIT passes the signature without a symbol; from_kernel_args (what stage 1 uses on a GPU)
    # fills the mangled one in. Both must match: the first H200 run matched none for this reason.
    named = _signature(128).with_mangled_symbol("matmul_kernel")
    assert named.symbol and named != _signature(128)
    handoff.drop(kernel)
    handoff.give(kernel, [type(h)(named, h.cubin, h.symbol, h.providers)], "sm_90")
    cubin, symbol, _, providers = kernel._compile(_signature(128), default_tile_context, (9, 0))
    assert (cubin, symbol, providers) == (h.cubin, h.symbol, ())
    assert calls == [] and handoff.used(kernel) == 1
    # Used once: the next miss (another arch here) goes to cuTile's own path.
    monkeypatch.undo()
    kernel2 = handoff.hinted_kernel(matmul_kernel, cfg.hints())
    handoff.give(kernel2, out[cfg].handoffs, "sm_90")
    result = kernel2._compile(_signature(128), default_tile_context, (10, 0))  # sm_100: not the handed-off arch
    assert handoff.used(kernel2) == 0 and result[0] != h.cubin


def test_unchanged_hints_keep_the_loaded_kernel():
    # exhaustive_search calls replace_hints on every candidate; a new object would have an empty
    # JIT cache and re-run the frontend before its first sample.
    from cutile_perf.tune import handoff
    from tests.tune_kernels import matmul_kernel

    kernel = handoff.hinted_kernel(matmul_kernel, {"occupancy": 2})
    assert kernel.replace_hints() is kernel
    assert kernel.replace_hints(occupancy=2) is kernel
    other = kernel.replace_hints(occupancy=4)
    assert other is not kernel and other._compiler_options.occupancy == 4
    assert kernel._compiler_options.occupancy == 2
    with pytest.raises(TypeError):
        kernel.replace_hints(not_a_hint=1)  # as cuTile's own replace_hints


def test_plain_objects_are_hinted_as_before():
    from cutile_perf.tune import handoff

    class Fake:
        def replace_hints(self, **hints):
            return ("hinted", hints)

    fake = Fake()
    assert handoff.hinted_kernel(fake, {}) is fake
    assert handoff.hinted_kernel(fake, {"occupancy": 2}) == ("hinted", {"occupancy": 2})
    assert handoff.give(fake, [object()], "sm_90") == 0
