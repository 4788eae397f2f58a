"""On the GPU: the bundled suite's correctness tests pass, for the kernels as shipped and for every
prepared optimization source, run by a real pytest subprocess exactly as the harness runs them."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cutile_perf import bench

SUITE = Path(__file__).resolve().parents[1] / "examples" / "kernels"
CORRECTNESS = "test_ and cutile and not test_perf"  # TileGym's correctness selector


def optimization_sources() -> list[Path]:
    return sorted((SUITE / "optimizations").glob("*/[0-9]*.py"))


def run_pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=1200)


@pytest.mark.gpu
def test_suite_correctness_tests_pass():
    # --defence: the defence tests (fresh inputs, NaN-poisoned outputs) run too instead of skipping.
    result = run_pytest(SUITE, "tests", "-k", CORRECTNESS, "--defence")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and not re.search(r"\d+ skipped", summary), summary


@pytest.mark.gpu
@pytest.mark.parametrize("source", optimization_sources(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_prepared_optimization_is_correct(source, tmp_path):
    """A prepared step that computes wrong results would make the demo show a crash, not a decision."""
    import yaml

    kernel_file = yaml.safe_load((source.parent / "steps.yaml").read_text())["kernel_file"]
    copy = tmp_path / "suite"
    shutil.copytree(SUITE, copy, ignore=shutil.ignore_patterns("__pycache__", "optimizations", "sandbox"))
    shutil.copyfile(source, copy / kernel_file)
    test_file = f"tests/ops/test_{source.parent.name}.py"
    result = run_pytest(copy, test_file, "-k", CORRECTNESS)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.gpu
def test_perf_test_records_a_tilegym_dict():
    """The harness reads `record_property("benchmark", ...)`; --print-record shows it as TileGym does."""
    result = run_pytest(SUITE, "tests/ops/test_rms_norm.py", "-k", "test_perf and cutile and 262144",
                        "--print-record", "-s")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "{'cutile': {'forward': {'mean':" in result.stdout


@pytest.mark.gpu
def test_bench_median_is_stable_across_calls():
    """Two back-to-back measurements of the same 512 MB copy agree within 5 % (cold L2, events)."""
    import torch

    src = torch.empty(256 * 2**20, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    first = sorted(bench.bench(lambda: dst.copy_(src)))
    second = sorted(bench.bench(lambda: dst.copy_(src)))
    m1, m2 = first[len(first) // 2], second[len(second) // 2]
    assert abs(m1 - m2) / m1 < 0.05, (m1, m2)
