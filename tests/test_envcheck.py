"""envcheck must report, never crash, whatever is missing."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from cutile_perf.child import envcheck


def test_check_without_gpu_tools_reports_a_gpu_problem(monkeypatch):
    monkeypatch.setattr(envcheck.shutil, "which", lambda name: None)
    monkeypatch.setattr(envcheck, "torch_gpu", lambda: (None, None, None, "torch is not importable (ImportError)"))
    env = envcheck.check()
    assert env.gpu is None and not env.can_measure
    whats = {p.what for p in env.problems}
    assert {"gpu", "torch"} <= whats
    text = envcheck.render(env)
    assert "GPU: none found" in text and "error:" in text


def test_nvidia_smi_output_is_parsed(monkeypatch):
    monkeypatch.setattr(envcheck.shutil, "which", lambda name: "/usr/bin/" + name)

    def fake_run(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 0, stdout="NVIDIA H200, 9.0, 580.65.06\n", stderr="")

    monkeypatch.setattr(envcheck.subprocess, "run", fake_run)
    assert envcheck._nvidia_smi() == ("NVIDIA H200", "9.0", "580.65.06")


def test_old_compute_capability_is_a_problem(monkeypatch):
    monkeypatch.setattr(envcheck, "_nvidia_smi", lambda: ("Tesla V100", "7.0", "550"))
    env = envcheck.check(with_torch=False)
    assert any("below 8.0" in p.message for p in env.problems)


def test_cuda_home_with_pip_tileiras_is_a_warning_not_an_error(monkeypatch):
    monkeypatch.setattr(envcheck, "_nvidia_smi", lambda: ("NVIDIA H200", "9.0", "580"))
    monkeypatch.setattr(envcheck, "_package_version", lambda *names: "13.4.92")
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda-12.4")
    env = envcheck.check(with_torch=False)
    problems = [p for p in env.problems if p.what == "cuda env"]
    assert problems and not problems[0].fatal_for_measuring and "CUDA_HOME" in problems[0].message
    assert env.can_measure
    assert env.cuda_env == {"CUDA_HOME": "/usr/local/cuda-12.4"}


def test_versions_line_and_snapshot_never_raise(monkeypatch):
    def boom(**kwargs):
        raise RuntimeError("probe exploded")

    assert "cuda-tile=" in envcheck.versions_line()
    monkeypatch.setattr(envcheck, "check", boom)
    assert "versions unavailable" in envcheck.versions_line()


def test_snapshot_has_the_logged_fields():
    snap = envcheck.snapshot()
    assert set(snap) >= {"gpu", "compute_capability", "driver", "cuda_tile", "tileiras"}


def test_probe_runs_the_check_once_in_the_background_and_waits_for_it(monkeypatch):
    import threading

    calls, release = [], threading.Event()

    def slow_check(*, with_torch=True):
        calls.append((threading.current_thread().name, with_torch))
        release.wait(5)
        return envcheck.Environment(gpu="NVIDIA H200", compute_capability="9.0")

    monkeypatch.setattr(envcheck, "check", slow_check)
    probe = envcheck.Probe()
    release.set()  # the command's own work would happen here, while the probe runs
    first, second = probe.result(), probe.result()
    assert first is second and first.gpu == "NVIDIA H200" and not first.gpu_problems
    assert calls == [("cutile-perf-envcheck", False)]  # one probe, off the main thread, without torch
    assert envcheck.Probe(background=False).result().gpu == "NVIDIA H200"


def test_gpu_problems_are_the_missing_or_too_old_gpu_only():
    env = envcheck.Environment(problems=(envcheck.Problem("gpu", "none"), envcheck.Problem("tileiras", "missing"),
                                         envcheck.Problem("compute capability", "7.0")))
    assert [p.what for p in env.gpu_problems] == ["gpu", "compute capability"]


# --- install hints match the pins (issue 21) ------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _gpu_extra() -> list[Requirement]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return [Requirement(r) for r in tomllib.load(fh)["project"]["optional-dependencies"]["gpu"]]


def _same(a: Requirement, b: Requirement) -> bool:
    return (canonicalize_name(a.name), a.extras, a.specifier) == (canonicalize_name(b.name), b.extras, b.specifier)


def test_the_install_hint_carries_the_gpu_extras_toolchain_pins():
    # `pip install 'cuda-tile[tileiras]'` alone can give tileiras 13.2, which cannot target Hopper.
    extra = _gpu_extra()
    for req in map(Requirement, envcheck.TOOLCHAIN_REQUIREMENTS):
        assert any(_same(req, pin) for pin in extra), f"{req} is not a pin of pyproject.toml's gpu extra"
    names = {canonicalize_name(Requirement(r).name) for r in envcheck.TOOLCHAIN_REQUIREMENTS}
    assert names == {"cuda-tile", "nvidia-cuda-tileiras", "nvidia-cuda-nvcc", "nvidia-nvvm"}


def test_the_gpu_extra_asks_for_nothing_torch_pins():
    # Issue 43: torch's CUDA wheels pin `cuda-toolkit` (==13.0.2 for torch 2.11): the gpu extra asking
    # for cuda-toolkit 13.4, itself or through cuda-tile[tileiras], made pip backtrack to torch 2.10.
    extra = _gpu_extra()
    assert not [str(r) for r in extra if canonicalize_name(r.name) == "cuda-toolkit"]
    assert not [str(r) for r in extra if canonicalize_name(r.name) == "cuda-tile" and r.extras]
    tileiras = next(r for r in extra if canonicalize_name(r.name) == "nvidia-cuda-tileiras")
    assert "13.4.92" in tileiras.specifier and "13.2.86" not in tileiras.specifier
    assert all(f"'{r}'" in envcheck.INSTALL_HINT for r in envcheck.TOOLCHAIN_REQUIREMENTS)


def test_env_and_compile_check_give_the_pinned_hint(monkeypatch):
    monkeypatch.setattr(envcheck, "_nvidia_smi", lambda: ("NVIDIA H200", "9.0", "580"))
    monkeypatch.setattr(envcheck, "_package_version", lambda *names: None)
    monkeypatch.setattr(envcheck, "_tileiras_version", lambda: None)
    problems = {p.what: p.message for p in envcheck.check(with_torch=False).problems}
    assert envcheck.INSTALL_HINT in problems["cuda-tile"] and envcheck.INSTALL_HINT in problems["tileiras"]

    from cutile_perf.errors import EnvMissing
    from cutile_perf.kernel import compilecheck

    monkeypatch.setitem(sys.modules, "cuda.tile", None)  # import cuda.tile raises ImportError
    with pytest.raises(EnvMissing) as raised:
        compilecheck.require_toolchain()
    assert envcheck.INSTALL_HINT in raised.value.hint


def test_no_other_module_spells_a_toolchain_pin():
    # One place: a hint written out elsewhere drifts from the pins.
    package = ROOT / "scripts" / "cutile_perf"
    spelled = [str(p.relative_to(package)) for p in package.rglob("*.py")
               if p.name != "envcheck.py" and re.search(r"cuda-(tile|toolkit)\[", p.read_text(encoding="utf-8"))]
    assert not spelled, f"install hints outside child/envcheck.py: {spelled}"


def test_the_torch_hint_carries_the_gpu_extras_torch_pin():
    # Issue 43: the base install has no torch; the hint installs the torch the extra asks for.
    extra = _gpu_extra()
    assert any(_same(Requirement(envcheck.TORCH_REQUIREMENT), pin) for pin in extra)
    assert f"'{envcheck.TORCH_REQUIREMENT}'" in envcheck.TORCH_INSTALL_HINT
