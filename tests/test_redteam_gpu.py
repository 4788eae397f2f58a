"""CPU checks of the GPU red team (benchmarks/redteam_gpu.py): attacks compile, the table is right,
and the suite's float64 check tells fp32 math from fp16/bf16 math. The GPU run itself is the script."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ATTACKS = sorted((ROOT / "benchmarks" / "redteam" / "attacks").glob("*.py"))


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def script():
    return _load(ROOT / "benchmarks" / "redteam_gpu.py", "_redteam_gpu")


def test_there_is_one_attack_per_letter_and_each_names_its_defence():
    assert [p.stem[0] for p in ATTACKS] == ["a", "b", "c", "d", "e"]
    assert set(script().DEFENCES) == {p.stem for p in ATTACKS}


@pytest.mark.toolchain
@pytest.mark.parametrize("path", ATTACKS, ids=lambda p: p.stem)
def test_attack_compiles_for_sm_90(path):
    pytest.importorskip("torch")
    assert script().compile_attack(path, "sm_90") >= 1


def test_table_marks_a_kept_attack_as_not_caught():
    results = [{"attack": "a_side_stream", "kept": False, "status": "crash", "crash_class": "error",
                "reason": "perf error: HiddenDeviceWork | x", "defence": "bench"},
               {"attack": "d_lower_precision", "kept": True, "status": "keep", "crash_class": None,
                "reason": "within noise", "defence": "float64"}]
    text = script().markdown(results)
    assert "| a_side_stream | no | crash | error | perf error: HiddenDeviceWork \\| x | bench |" in text
    assert "**KEPT: NOT CAUGHT**" in text and "NOT CAUGHT: d_lower_precision was kept" in text


def _half_math_softmax(x, dtype, tile=1024):
    """The d_lower_precision kernel's arithmetic on CPU: every intermediate rounded to ``dtype``."""
    import torch

    run_max = torch.full((x.shape[0], 1), float("-inf"), dtype=dtype)
    run_sum = torch.zeros((x.shape[0], 1), dtype=dtype)
    for j in range(0, x.shape[1], tile):
        t = x[:, j:j + tile]
        new_max = torch.maximum(run_max, t.max(dim=1, keepdim=True).values)
        e = torch.exp((t - new_max).float()).to(dtype)
        run_sum = (run_sum * torch.exp((run_max - new_max).float()).to(dtype)) + e.sum(dim=1, keepdim=True)
        run_max = new_max
    return (torch.exp((x - run_max).float()).to(dtype) / run_sum).to(dtype)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_float64_check_accepts_fp32_math_and_rejects_half_math_and_zeros(dtype_name):
    torch = pytest.importorskip("torch")
    common = _load(ROOT / "examples" / "kernels" / "tests" / "common.py", "_suite_common")
    dtype = getattr(torch, dtype_name)
    x = (torch.randn(32, 4096, generator=torch.Generator().manual_seed(0)) * 2).to(dtype)
    ref = torch.softmax(x.double(), -1)
    common.assert_matches_float64(torch.softmax(x.float(), -1).to(dtype), ref, dtype, "fp32 math")
    for bad in (_half_math_softmax(x, dtype), torch.zeros_like(x)):
        with pytest.raises(AssertionError, match="correctly rounded float64"):
            common.assert_matches_float64(bad, ref, dtype, "attack")
