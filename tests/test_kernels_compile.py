"""Every bundled cuTile kernel compiles for sm_80, sm_90 and sm_100 without a GPU.

Covers the suite's op modules (``examples/kernels/src/tilesuite/ops/cutile/*.py``) and every
prepared optimization source (``examples/kernels/optimizations/<op>/*.py``), each through its
``aot_signatures()`` hook and ``cuda.tile.compilation.export_kernel``. This catches a kernel edit
that breaks on one architecture (the H200 is sm_90, TileGym's own target is sm_100) in CPU CI.
"""
from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[1] / "examples" / "kernels"
ARCHS = ("sm_80", "sm_90", "sm_100")


def kernel_sources() -> list[Path]:
    ops = sorted(p for p in (SUITE / "src" / "tilesuite" / "ops" / "cutile").glob("*.py") if not p.name.startswith("_"))
    return ops + sorted((SUITE / "optimizations").glob("*/*.py"))


def load_module(path: Path):
    """Import a kernel file under a unique name (optimization files are not importable by name)."""
    pytest.importorskip("torch")  # the op modules' host wrappers import torch
    src = str(SUITE / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    name = "_aot_" + "_".join(path.relative_to(SUITE).with_suffix("").parts).replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_suite_has_the_kernels_the_demo_and_benchmark_use():
    names = {p.stem for p in kernel_sources()}
    assert {"swiglu", "rms_norm", "softmax", "layer_norm"} <= names


@pytest.mark.toolchain
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", kernel_sources(), ids=lambda p: str(p.relative_to(SUITE)))
def test_kernel_compiles(path, arch):
    from cuda.tile.compilation import export_kernel

    module = load_module(path)
    hook = getattr(module, "aot_signatures", None)
    assert callable(hook), f"{path.name} has no aot_signatures(); see examples/kernels/README.md"
    pairs = hook()
    assert pairs, f"{path.name}: aot_signatures() returned nothing to compile"
    for kernel, signatures in pairs:
        cubin = io.BytesIO()
        export_kernel(kernel, signatures, cubin, gpu_code=arch, output_format="cubin")
        assert cubin.getvalue()[:4] == b"\x7fELF", f"{path.name} {arch}: output is not an ELF cubin"


def load_benchmark():
    """benchmarks/kernels.py as a module (registered first: its dataclasses look themselves up)."""
    pytest.importorskip("torch")
    pytest.importorskip("yaml")
    path = SUITE.parents[1] / "benchmarks" / "kernels.py"
    spec = importlib.util.spec_from_file_location("_bench_kernels", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("op", sorted(p.parent.name for p in (SUITE / "optimizations").glob("*/steps.yaml")))
def test_steps_yaml_best_is_an_importable_step(op):
    """benchmarks/kernels.py times `best:` next to the plain kernel; it must name a listed, loadable step."""
    import yaml

    data = yaml.safe_load((SUITE / "optimizations" / op / "steps.yaml").read_text(encoding="utf-8"))
    assert data.get("best") in [step["file"] for step in data["steps"]], f"{op}: best {data.get('best')!r}"
    module = load_module(SUITE / "optimizations" / op / data["best"])
    plain = load_module(SUITE / data["kernel_file"])
    public = [name for name in vars(plain) if not name.startswith("_") and callable(getattr(plain, name))
              and getattr(getattr(plain, name), "__module__", None) == plain.__name__]
    assert public and all(callable(getattr(module, name, None)) for name in public), public


def test_benchmark_times_plain_then_best_or_every_step():
    bench = load_benchmark()
    for case in bench.FULL_CASES + bench.QUICK_CASES:
        labels = [label for label, _ in bench.versions(case.module, all_steps=False)]
        assert labels[0] == "plain" and len(labels) == 2 and labels[1].endswith(" (best)"), labels
    for op in ("rms_norm", "layer_norm", "softmax", "swiglu"):
        everything = bench.versions(op, all_steps=True)
        listed = [step["file"] for step in bench.steps_file(op)["steps"]]
        assert everything[0] == ("plain", None)
        assert [p.name for _, p in everything[1:]] == listed  # every step file, in steps.yaml order
        assert sum(label.endswith(" (best)") for label, _ in everything) == 1


def test_benchmark_small_case_keeps_row_length_and_dtype():
    """--precompile compiles on 512-row inputs: same dtype and row length, so the same specialization."""
    bench = load_benchmark()
    for case in bench.FULL_CASES:
        small = bench.small(case)
        if case.kind == "memory":
            assert small.shape == (512, *case.shape[1:]) and small.dtype == case.dtype
            assert small.shape[0] % 16 == 0  # the JIT's shape-divisibility bit is the same as for the full case
        else:
            assert small == case


def test_benchmark_goal_column():
    goal = load_benchmark().goal_status
    assert goal("memory", 92.0, 0.20, 0.25) == "met"
    assert goal("memory", 88.0, 0.2866, 0.2560) == "missed: 4.0 pts below 92 % of ceiling; 12.0 % slower than torch.compile"
    assert goal("memory", 97.0, 0.25, 0.26, 0.25) == "met"  # as fast as TileGym counts
    assert goal("memory", 97.0, 0.26, 0.27, 0.25) == "missed: 4.0 % slower than TileGym"
    assert goal("memory", 95.0, 0.30, 0.25) == "missed: 20.0 % slower than torch.compile"
    assert goal("matmul", 96.6, 0.213, 0.196) == "met"  # torch.compile is not part of the compute-bound goal
    assert goal("attention", 47.0, 1.9, 0.9) == "missed: 43.0 pts below 90 % of ceiling"
    assert goal("memory", None, None, 0.3) == "n/a"


def load_sweep():
    pytest.importorskip("torch")
    pytest.importorskip("yaml")
    pytest.importorskip("cuda.tile")
    bench_dir = str(SUITE.parents[1] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    import kernel_sweep

    return kernel_sweep


def test_sweep_rounds_partition_the_configs_of_every_memory_case():
    sweep = load_sweep()
    for case in [c for c in sweep.kb.FULL_CASES if c.kind == "memory"]:
        everything = sweep.configs_for(case)
        by_round = [cfg for r in (1, 2, 3, 4, 5) for cfg in sweep.configs_for(case, {r})]
        assert everything == by_round and everything
        if case.module != "layer_norm":  # one-pass statistics and round 4's knobs exist only in the layer norm kernel
            assert not any(getattr(cfg, k, False) for cfg in everything for k in ("one_pass", "cheap_stats", "affine_fma"))
            assert not sweep.configs_for(case, {4})
    # the first round starts from the shipped kernels' configs: plain SwiGLU and the former best row layout
    assert sweep.SWIGLU_ROUNDS[1][0] == sweep.SwigluConfig(1, 1024, 0, False)
    first = sweep.row_configs(2048, {1})[0]
    assert (first.tile_m, first.occupancy, first.persistent, first.load_tma, first.store_tma) == (8, 4, True, True, True)


@pytest.mark.toolchain
def test_sweep_kernels_compile_for_sm90():
    """The sweep's parameterized kernels compile with the flags they are launched with."""
    import cuda.tile as ct
    from cuda.tile.compilation import export_kernel

    sweep = load_sweep()
    src = str(SUITE / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    from tilesuite.aot import contiguous, scalar, signature

    h2, h1, b2, b1 = (contiguous(ct.float16, 2), contiguous(ct.float16, 1), contiguous(ct.bfloat16, 2),
                      contiguous(ct.bfloat16, 1))
    cases = [  # BOUNDS (the row kernels' last flag, the flat SwiGLU's next to last): False = check_bounds=False
        (sweep.rms_norm_kernel, [h2, h1, h2, scalar(ct.float32), 8, 1024, False, True, False, True]),
        (sweep.rms_norm_kernel, [h2, h1, h2, scalar(ct.float32), 8, 1024, False, True, False, False]),
        (sweep.layer_norm_kernel, [h2, h1, h1, h2, scalar(ct.float32), 8, 1024, True, True, False, True, False, False,
                                   True]),
        (sweep.layer_norm_kernel, [h2, h1, h1, h2, scalar(ct.float32), 8, 1024, False, True, False, True, True, True,
                                   True]),
        (sweep.layer_norm_kernel, [h2, h1, h1, h2, scalar(ct.float32), 8, 1024, False, True, False, True, True, True,
                                   False]),
        (sweep.layer_norm_kernel, [h2, h1, h1, h2, scalar(ct.float32), 16, 1024, True, True, False, True, True, True,
                                   True]),
        (sweep.softmax_kernel, [h2, h2, 1, 4096, False, False, False]),
        (sweep.swiglu_kernel, [b2, b2, b2, 1, 1024, True, 0]),
        (sweep.swiglu_flat_kernel, [b1, b1, b1, 1024, True, 0]),
        (sweep.swiglu_flat_kernel, [b1, b1, b1, 1024, False, 10]),
    ]
    for kernel, params in cases:
        cubin = io.BytesIO()
        export_kernel(kernel.replace_hints(occupancy=4), [signature(params)], cubin, gpu_code="sm_90",
                      output_format="cubin")
        assert cubin.getvalue()[:4] == b"\x7fELF"
