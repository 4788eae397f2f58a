"""benchmarks/matmul_sweep.py without a GPU: the config grid is legal on the README shapes, the
command line parses, and (toolchain) the sweep kernel at step 03's and step 07's configs, and at the
tuner's num_worker_warps=8 config, is the machine code those steps launch."""
from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "examples" / "kernels" / "optimizations" / "matmul"


def load_sweep():
    pytest.importorskip("torch")
    pytest.importorskip("yaml")
    pytest.importorskip("cuda.tile")
    for path in (str(ROOT / "benchmarks"), str(ROOT / "scripts"), str(ROOT / "examples" / "kernels" / "src")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import matmul_sweep

    return matmul_sweep


def load_step(name: str):
    spec = importlib.util.spec_from_file_location(f"matmul_step_{name[:2]}", STEPS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_is_legal_on_both_readme_shapes():
    sweep = load_sweep()
    shapes = [case.shape for case in sweep.CASES]
    assert shapes == [(4096, 4096, 4096), (8192, 8192, 8192)]
    labels = [cfg.label() for cfg, _why in sweep.CONFIGS]
    assert len(labels) == len(set(labels)), "two configs share a label (the table is keyed by it)"
    assert 20 <= len(labels) <= 40
    for cfg, why in sweep.CONFIGS:
        assert why, f"{cfg.label()}: every config says why it is in the grid"
        assert sweep.config_problems(cfg, shapes) == [], cfg.label()
    # The first config is step 03's (the best step before 07), so the run shows the sweep kernel matches the step file.
    step = load_step("03-occupancy-2.py")
    first = sweep.CONFIGS[0][0]
    assert (first.tm, first.tn, first.tk, first.group, first.occupancy) == (
        step.TILE_M, step.TILE_N, step.TILE_K, step.GROUP_M, step.OCCUPANCY)
    assert first.hints() == {"occupancy": 2} and first.constants()[3:] == [8, 0, True, False, True]


def test_config_problems_name_what_is_illegal():
    sweep = load_sweep()
    c = sweep.MatmulConfig
    assert sweep.config_problems(c(128, 192, 64), [(4096, 4096, 4096)]) == ["tile N 192 is not a power of two"]
    assert sweep.config_problems(c(128, 128, 64, warps=2), []) == [
        "num_worker_warps 2: only 4 or 8 with tileiras 13.4"]
    assert sweep.config_problems(c(128, 128, 64, checked=False), [(4096, 4000, 4096)]) == [
        "unchecked but 4096x4000x4096 is not whole 128x128x64 tiles"]
    assert sweep.config_problems(c(128, 128, 64, latency=11, num_ctas=3), []) == [
        "num_ctas 3 is not a power of two in 1..16", "latency 11 outside 1..10 (0 = no hint)"]


def test_persistent_grid_is_one_wave_of_clusters(monkeypatch):
    sweep = load_sweep()
    monkeypatch.setattr(sweep, "sm_count", lambda device_index: 132)
    c = sweep.MatmulConfig
    assert c(128, 256, 64).grid(4096, 4096, 0) == (512, 1, 1)
    assert c(128, 256, 64, persistent=True).grid(4096, 4096, 0) == (132, 1, 1)
    assert c(128, 256, 64, num_ctas=2, persistent=True).grid(4096, 4096, 0) == (66, 1, 1)
    assert c(128, 128, 64, 2, persistent=True).grid(256, 256, 0) == (4, 1, 1)  # fewer tiles than slots


def test_command_line(capsys, monkeypatch):
    sweep = load_sweep()
    assert sweep.main(["--list", "--only", "w8"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed and all(" w8 " in line for line in listed)
    with pytest.raises(SystemExit):
        sweep.main(["--rounds", "0"])
    monkeypatch.setattr(sweep.torch.cuda, "is_available", lambda: False)
    assert sweep.main(["--rounds", "1"]) == 3  # a GPU run without a GPU says so and stops


def _cubin_info(sweep, kernel, signature) -> dict:
    """Registers, stack, shared memory, threads and SASS digest of ``kernel``'s sm_90 cubin."""
    from cutile_perf.kernel.compile_report import find_cuobjdump, inspect_cubin
    from cutile_perf.kernel.compilecheck import compile_signature

    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found: no SASS to compare")
    with tempfile.TemporaryDirectory() as tmp:
        cubin, _remarks = compile_signature(kernel, signature, "sm_90", Path(tmp))
        path = Path(tmp) / "step.cubin"
        path.write_bytes(cubin)
        return {**inspect_cubin(path, cuobjdump), "sass_digest": sweep.sass_digest(path, cuobjdump)}


def _assert_same_kernel(sweep, info: dict, label: str) -> None:
    config = next(cfg for cfg, _why in sweep.CONFIGS if cfg.label() == label)
    ours = sweep.inspect_config(config)
    for key in ("sass_digest", "registers", "stack", "shared", "threads"):
        assert ours[key] == info[key], key


@pytest.mark.toolchain
@pytest.mark.parametrize("step_file, label", [
    ("03-occupancy-2.py", "128x128x64 occ2 g8"),  # the sweep's first config: step 03, the best step before 07
    ("07-two-warpgroups-128x256.py", "128x256x64 occ1 w8 g8 lat10"),  # the sweep's measured best: step 07, best:
])
def test_sweep_kernel_at_a_step_config_is_that_step(step_file, label):
    """Same SASS, registers and shared memory as the step file: the sweep times the step's kernel."""
    sweep = load_sweep()
    kernel, signatures = load_step(step_file).aot_signatures()[0]
    _assert_same_kernel(sweep, _cubin_info(sweep, kernel, signatures[0]), label)


@pytest.mark.toolchain
def test_tuner_two_warpgroup_config_is_the_swept_one():
    """Step 06's tuner at the sm_90 space's num_worker_warps=8 config launches the sweep's
    128x256x64 occ1 w8 g8 (no latency hint): the space quotes that config's measured figures."""
    sweep = load_sweep()
    from cutile_perf.tune.spaces import matmul_space

    import cuda.tile as ct
    from tilesuite.aot import contiguous, signature

    step = load_step("06-autotune.py")
    [cfg] = [c for c in matmul_space("sm_90") if c.get("num_worker_warps") == 8]
    sig = signature([contiguous(ct.bfloat16, 2)] * 3 + [cfg.TILE_M, cfg.TILE_N, cfg.TILE_K, step.GROUP_M])
    info = _cubin_info(sweep, step.make_tuner("sm_90").kernel_for(cfg), sig)
    _assert_same_kernel(sweep, info, "128x256x64 occ1 w8 g8")


def test_gpu_path_logic_on_cpu_stand_ins(capsys, monkeypatch):
    """main() end to end with the GPU parts replaced: torch.matmul on small CPU tensors for every
    config, fixed times. Checks the rounds, the correctness gate, the medians and the table's order."""
    import types

    sweep = load_sweep()
    torch = sweep.torch
    times = iter(range(1, 10_000))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="stand-in", major=9, minor=0, multi_processor_count=132))
    monkeypatch.setattr(sweep.kb, "make_inputs", lambda case: (torch.ones(8, 4), torch.ones(4, 8)))
    # cuBLAS 1.0 ms; the best step 1.25 ms; configs 2.0 ms, except one that is wrong and one that raises.
    speed = {"cuBLAS": 1.0, "best": 1.25}

    def fake_time(fn, budget):
        next(times)
        return speed.get(getattr(fn, "tag", "config"), 2.0), ""

    def tagged(tag, fn):
        wrapper = lambda a, b: fn(a, b)  # noqa: E731
        wrapper.tag = tag
        return wrapper

    monkeypatch.setattr(sweep.kb, "try_time", lambda call, budget: fake_time(call.func, budget))  # a partial
    monkeypatch.setattr(sweep.torch, "matmul", tagged("cuBLAS", torch.matmul), raising=True)
    monkeypatch.setattr(sweep, "best_step", lambda: ("step 03-occupancy-2 (best)", tagged("best", torch.mm)))
    cfgs = sweep.configs()

    def function(cfg):
        if cfg == cfgs[1]:
            return lambda a, b: torch.zeros(8, 8)  # wrong result: reported, never timed
        if cfg == cfgs[2]:
            def broken(a, b):
                raise RuntimeError("does not compile")
            return broken
        return tagged("config", torch.mm)

    monkeypatch.setattr(sweep, "matmul_function", function)
    assert sweep.main(["--rounds", "2", "--no-registers"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| config | 4096x4096x4096 ms | 8192x8192x8192 ms |")
    assert table[1].startswith("| cuBLAS (torch.matmul) | 1.0000 | 1.0000 | 100.0 % | 100.0 % |")
    assert table[2].startswith("| step 03-occupancy-2 (best) | 1.2500 | 1.2500 | 80.0 % | 80.0 % |")
    assert table[3].startswith(f"| {cfgs[0].label()} | 2.0000 | 2.0000 | 50.0 % | 50.0 % |")
    wrong = next(line for line in table if line.startswith(f"| {cfgs[1].label()} |"))
    assert "n/a | n/a | n/a | n/a" in wrong and "WRONG result" in wrong
    broken = next(line for line in table if line.startswith(f"| {cfgs[2].label()} |"))
    assert "RuntimeError: does not compile" in broken
    assert table.index(wrong) > 3 and table.index(broken) > 3  # failures sort last
    # 2 rounds x 2 shapes x (2 cuBLAS + best + configs that run)
    assert next(times) == 1 + 2 * 2 * (3 + len(cfgs) - 2)
