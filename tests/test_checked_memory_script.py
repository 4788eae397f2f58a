"""benchmarks/checked_memory.py on the CPU, over the SIMULATED TileGym op of tests/fixtures_checked.py:
both arms run, the checked arm really captures (its folder is not empty), and the summary is the
difference of the arms' medians. Peak GPU memory is None on the CPU; the GPU run gives the figure."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from fixtures_checked import TEST_REL, add_checked_op
from fixtures_repo import tilegym_like_repo  # noqa: F401

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("checked_memory_script", BENCH / "checked_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summary_is_the_difference_of_the_arms_medians(script):
    runs = [{"arm": "plain", "allocated_mib": a, "reserved_mib": a + 10} for a in (100.0, 104.0, 90.0)]
    runs += [{"arm": "checked", "allocated_mib": a, "reserved_mib": a + 20} for a in (150.0, 140.0, 160.0)]
    table = script.summary(runs)
    assert table["plain"] == {"allocated_mib": 100.0, "reserved_mib": 110.0}
    assert table["extra_allocated_mib"] == 50.0 and table["extra_reserved_mib"] == 60.0
    assert "extra_allocated_mib" not in script.summary([{"arm": "plain", "allocated_mib": None, "reserved_mib": None}])


def test_both_arms_run_and_the_checked_arm_captures(script, tilegym_like_repo, tmp_path, monkeypatch):
    repo = add_checked_op(tilegym_like_repo)
    scripts_dir = str(Path(__file__).resolve().parent.parent / "scripts")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([scripts_dir, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    plain = script.one_run(repo, TEST_REL, "test_perf and 4-512", False, tmp_path)
    checked = script.one_run(repo, TEST_REL, "test_perf and 4-512", True, tmp_path)
    assert plain["exit"] == 0 and checked["exit"] == 0, (plain, checked)
    assert plain["captured_files"] == 0 and checked["captured_files"] > 0
    assert plain["allocated_mib"] is None  # no CUDA here: the figure comes from the GPU run
