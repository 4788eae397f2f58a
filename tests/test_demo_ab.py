"""``benchmarks/demo_ab.sh``: the demo run by two versions of the harness in turn.

On a machine without a GPU the demo refuses at once, which is enough to check what the script
itself does: which package each run imports, and what it refuses.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "demo_ab.sh"
NO_GPU = pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                            reason="with a GPU the demo would run in full (minutes); this checks the script's plumbing")


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEMO_TIMEOUT": "60", "PYTHONPATH": ""}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_an_unknown_version_is_refused_in_one_line(tmp_path):
    done = _run(tmp_path, str(tmp_path / "out"), "newer")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["demo_ab: newer is neither new nor old"]


def test_old_without_an_old_tree_is_refused(tmp_path):
    done = _run(tmp_path, str(tmp_path / "out"), "old", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert "no old tree" in done.stderr


@NO_GPU
def test_each_run_imports_the_harness_its_version_names(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(ROOT / "scripts", old / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    done = _run(tmp_path, str(out), "new old", str(old))
    assert done.returncode == 0, done.stderr
    new_log = (out / "1-new" / "demo.txt").read_text()
    old_log = (out / "2-old" / "demo.txt").read_text()
    assert f"harness: {ROOT / 'scripts' / 'cutile_perf' / '__init__.py'}" in new_log
    assert f"harness: {old / 'scripts' / 'cutile_perf' / '__init__.py'}" in old_log
    # No GPU: each demo refused before copying anything, and the script said how it ended.
    for log in (new_log, old_log):
        assert "cannot run here" in log and log.rstrip().splitlines()[-1].startswith("exit 3,")
    # The old tree reads this checkout's suite and templates through links, made once.
    assert (old / "examples").is_symlink() and (old / "templates").is_symlink()


def test_a_version_ending_in_jobs_passes_correctness_jobs_to_its_demo(tmp_path):
    """``new+jobs0``: the demo is asked for --correctness-jobs 0 and refuses it (exit 2) before it
    looks for a GPU, on any machine."""
    out = tmp_path / "out"
    done = _run(tmp_path, str(out), "new+jobs0")
    assert done.returncode == 0, done.stderr
    log = (out / "1-new-jobs0" / "demo.txt").read_text()
    assert "demo arguments: --kernel rmsnorm --correctness-jobs 0 (" in log
    assert "--correctness-jobs must be from 1 to 16, not 0" in log
    assert log.rstrip().splitlines()[-1].startswith("exit 2,")


@NO_GPU
def test_a_version_ending_in_nobytecode_switches_the_installed_bytecode_off(tmp_path):
    """``new+nobytecode``: that run's harness has CUTILE_PERF_INSTALLED_BYTECODE=0 (child/bytecode.py),
    a plain ``new`` run has 1."""
    out = tmp_path / "out"
    done = _run(tmp_path, str(out), "new+nobytecode new")
    assert done.returncode == 0, done.stderr
    assert "(CUTILE_PERF_INSTALLED_BYTECODE=0)" in (out / "1-new-nobytecode" / "demo.txt").read_text()
    assert "(CUTILE_PERF_INSTALLED_BYTECODE=1)" in (out / "2-new" / "demo.txt").read_text()


def test_a_version_ending_in_nospares_runs_its_demo_without_spare_perf_children(tmp_path):
    """``new+nospares``: that run's demo gets --no-prestart-perf (a demo argument, parsed before the
    GPU check, so a machine without a GPU still shows it in the log)."""
    out = tmp_path / "out"
    done = _run(tmp_path, str(out), "new+nospares")
    assert done.returncode == 0, done.stderr
    log = (out / "1-new-nospares" / "demo.txt").read_text()
    assert "demo arguments: --kernel rmsnorm --no-prestart-perf (" in log
    assert "unrecognized arguments" not in log
