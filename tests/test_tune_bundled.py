"""The bundled matmul's autotuned step (examples/kernels/optimizations/matmul/06-autotune.py) on CPU.

Its space is the measured sm_90 list with step 03's config as the fixed one; DISABLE_AUTOTUNE=1
launches that config without compiling or timing anything; every config of the sm_90 space
compiles for sm_90 through our own parallel precompile stage (toolchain only, no GPU).
"""
from __future__ import annotations

import pytest

from cutile_perf.tune import Config
from cutile_perf.tune.spaces import matmul_space
from tests.test_kernels_compile import SUITE, load_module

STEP = SUITE / "optimizations" / "matmul" / "06-autotune.py"
STEP_03 = Config(TILE_M=128, TILE_N=128, TILE_K=64, occupancy=2, num_ctas=1)


@pytest.fixture(scope="module")
def step():
    return load_module(STEP)


def test_space_is_the_measured_sm90_list_with_step_03_first(step):
    tuner = step.make_tuner("sm_90")
    assert step.FIXED == STEP_03 and tuner.fixed == STEP_03
    assert tuner.space[0] == STEP_03
    assert set(tuner.space) == {STEP_03, *matmul_space("sm_90")} and len(tuner.space) <= 8


def test_disable_autotune_launches_step_03_config(step, monkeypatch):
    monkeypatch.setenv("DISABLE_AUTOTUNE", "1")
    tuner = step.make_tuner("sm_90")

    def never(*args, **kwargs):
        raise AssertionError("nothing may be compiled or timed when autotuning is disabled")

    tuner.precompile = tuner.timer = never
    tuned = tuner.tune((4096, 4096, 4096, "bf16"), None, never, never)
    assert tuned.config == STEP_03 and tuner.reports[(4096, 4096, 4096, "bf16")].source == "disabled"
    assert tuned.kernel is tuner.kernel_for(STEP_03)


@pytest.mark.toolchain
def test_every_sm90_config_compiles_through_the_parallel_precompile(step, tmp_path):
    from cuda.tile.compilation import CallingConvention, KernelSignature
    from tilesuite.aot import contiguous

    import cuda.tile as ct
    from cutile_perf.tune.precompile import CompileJob, KernelRef, compiler_options, run_jobs, shutdown_pool

    kernel = step.matmul_kernel
    jobs = []
    for cfg in step.make_tuner("sm_90").space:
        sig = KernelSignature([contiguous(ct.bfloat16, 2) for _ in range(3)] + [cfg.TILE_M, cfg.TILE_N, cfg.TILE_K, 8],
                              CallingConvention.cutile_python_v1())
        jobs.append(CompileJob(cfg, KernelRef.of(kernel), compiler_options(kernel, cfg.hints()), (sig,), "sm_90",
                               str(tmp_path), 300.0))
    try:
        outcomes = run_jobs(jobs, workers=2)
    finally:
        shutdown_pool()
    assert {c: o.status for c, o in outcomes.items()} == {j.config: "ok" for j in jobs}, \
        [o.detail[-300:] for o in outcomes.values() if o.status != "ok"]
