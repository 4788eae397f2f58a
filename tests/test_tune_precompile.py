"""Stage 1 (parallel precompile) fills cuTile's disk cache so the main process's JIT compile is a hit.

Toolchain tests (cuda-tile + tileiras, no GPU): the signature is written by hand (from_kernel_args
needs libcuda), worker processes compile, then the main process calls ``kernel._compile`` — the
method the JIT calls on a miss — and we count tileiras runs. The GPU test in test_tune_gpu.py
checks the same through real ``ct.launch`` calls.
"""
from __future__ import annotations

import sqlite3

import pytest

from cutile_perf.tune.config import Config
from cutile_perf.tune.precompile import (CompileJob, KernelRef, compile_cost, compiler_options, run_jobs,
                                         shutdown_pool)

pytestmark = pytest.mark.toolchain


def _signature(tm):
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint, CallingConvention, KernelSignature

    def arr():
        return ArrayConstraint(ct.float16, 2, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
                               may_alias_internally=False, stride_constant=(None, 1), stride_divisible_by=(8, 1),
                               shape_divisible_by=16, base_addr_divisible_by=16)

    return KernelSignature([arr(), arr(), arr(), tm, 64, 32], CallingConvention.cutile_python_v1())


def _entries(cache_dir):
    return sqlite3.connect(str(cache_dir / "cache.db")).execute("select count(*) from cache").fetchone()[0]


@pytest.fixture
def tile_cache(tmp_path, monkeypatch):
    from cuda.tile._cext import default_tile_context

    monkeypatch.setattr(default_tile_context.config, "cache_dir", str(tmp_path))
    yield tmp_path
    shutdown_pool()


def test_worker_filled_cache_is_hit_by_the_jit_compile_path(tile_cache, monkeypatch):
    import cuda.tile._compile as compile_mod
    from cuda.tile._cext import default_tile_context
    from tests.tune_kernels import matmul_kernel

    configs = [Config(TM=64, occupancy=2), Config(TM=128, occupancy=1), Config(TM=64, occupancy=3)]
    jobs = [CompileJob(c, KernelRef.of(matmul_kernel), compiler_options(matmul_kernel, c.hints()),
                       (_signature(c.TM),), "sm_90", str(tile_cache), 120.0) for c in configs]
    reported = []
    outcomes = run_jobs(jobs, workers=2, on_done=reported.append)
    assert {o.status for o in outcomes.values()} == {"ok"}, outcomes
    assert sorted(reported, key=repr) == sorted(outcomes.values(), key=repr)  # each one reported as it finished
    assert _entries(tile_cache) == 3

    tileiras_runs = []
    real = compile_mod.compile_cubin
    monkeypatch.setattr(compile_mod, "compile_cubin", lambda *a, **k: (tileiras_runs.append(a), real(*a, **k))[1])
    for c in configs:
        matmul_kernel.replace_hints(**c.hints())._compile(_signature(c.TM), default_tile_context, (9, 0))
    assert tileiras_runs == []  # every config was a disk-cache hit
    # Negative control: a hint the workers did not compile does run tileiras.
    matmul_kernel.replace_hints(occupancy=4)._compile(_signature(64), default_tile_context, (9, 0))
    assert len(tileiras_runs) == 1


def test_compile_error_is_a_per_config_result(tile_cache):
    from tests.tune_kernels import broken_kernel, matmul_kernel

    good = Config(TM=64)
    bad = Config(TM=32)
    jobs = [CompileJob(good, KernelRef.of(matmul_kernel), compiler_options(matmul_kernel, {}), (_signature(64),),
                       "sm_90", str(tile_cache), 120.0),
            CompileJob(bad, KernelRef.of(broken_kernel), compiler_options(broken_kernel, {}), (_signature(32),),
                       "sm_90", str(tile_cache), 120.0)]
    outcomes = run_jobs(jobs, workers=2)
    assert outcomes[good].status == "ok"
    assert outcomes[bad].status == "compile" and outcomes[bad].detail


def test_closure_kernels_are_not_sent_to_workers():
    import cuda.tile as ct

    @ct.kernel
    def local_kernel(x):
        pass

    assert KernelRef.of(local_kernel) is None


def test_largest_tiles_are_scheduled_first():
    configs = [Config(TILE_M=64, TILE_N=64, occupancy=2), Config(TILE_M=256, TILE_N=128), Config(occupancy=4),
               Config(BLOCK_SIZE=1024, flag=True)]
    assert [compile_cost(c) for c in configs] == [4096, 32768, 0, 1024]
    assert sorted(configs, key=compile_cost, reverse=True)[0] == Config(TILE_M=256, TILE_N=128)
