"""tileir-check: valid JSON whatever the install looks like; exit 1 unless TileIR is active ("ready": false)."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from optional_deps import needs

from cutile_perf import cli
from cutile_perf.child import envcheck
from cutile_perf.tileir import check

REPO = Path(__file__).resolve().parents[1]
REQUIRED_KEYS = {"triton", "tileir_backend_installed", "active_target", "tileir_active", "enable_tile", "gpu",
                 "gpu_capability", "blackwell_gpu", "tileiras", "tileiras_supports_gpu", "ready", "recommendation"}


def _run_cli(capsys, *args: str) -> tuple[int, dict]:
    code = cli.main(["tileir-check", *args])
    return code, json.loads(capsys.readouterr().out)


@needs("triton")
def test_this_machine_reports_standard_triton_not_ready(capsys):
    code, report = _run_cli(capsys)
    assert code == 1  # "ready": false is a check saying "not ready" (issue 21)
    assert REQUIRED_KEYS <= set(report)
    assert report["triton"]["importable"] is True and report["triton"]["version"]
    # CPU machine: no driver is active, so the target is unknown and TileIR is not active.
    assert report["tileir_active"] is False and report["ready"] is False
    assert report["gpu"]["capability"] is None and report["blackwell_gpu"] is None


@pytest.mark.parametrize("args", [(), ("--strict",)])
def test_not_ready_exits_1_with_or_without_strict(capsys, args):
    """Issue 21: `"ready": false` with exit 0 let a script go on as if TileIR were there."""
    code, report = _run_cli(capsys, *args)
    assert code == 1 and report["ready"] is False


def test_no_triton_installed_gives_json_and_exit_1(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    code, report = _run_cli(capsys)
    assert code == 1 and report["ready"] is False
    assert report["triton"]["importable"] is False and "ModuleNotFoundError" in report["triton"]["error"]
    assert report["recommendation"].startswith("triton does not import")


def test_triton_import_raising_anything_is_reported(monkeypatch):
    def broken(name):
        raise RuntimeError("libcuda.so: undefined symbol")

    monkeypatch.setattr(check.importlib, "import_module", broken)
    report = check.check()
    assert report["triton"]["error"] == "RuntimeError: libcuda.so: undefined symbol"
    json.dumps(report)


def test_triton_without_runtime_api_is_reported(monkeypatch):
    fake = types.ModuleType("triton")  # a stub: no __version__, no runtime subpackage
    monkeypatch.setitem(sys.modules, "triton", fake)
    monkeypatch.setitem(sys.modules, "triton.runtime", None)
    report = check.check()
    assert report["triton"]["importable"] is True and report["triton"]["version"] is None
    assert report["active_target"]["backend"] is None and report["active_target"]["error"]
    assert report["tileir_active"] is False


def test_broken_triton_package_in_a_subprocess(tmp_path):
    """A triton whose __init__ raises, first on sys.path: the real shim still prints JSON (exit 1: not ready)."""
    pkg = tmp_path / "triton"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise OSError('simulated broken install')\n")
    env = {"PYTHONPATH": f"{tmp_path}:{REPO / 'scripts'}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "tileir_check.py")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["triton"]["error"] == "OSError: simulated broken install" and report["ready"] is False


class _FakeTarget:
    def __init__(self, backend, arch):
        self.backend, self.arch = backend, arch


class _FakeDriver:
    def __init__(self, backend):
        self.backend = backend

    def get_current_target(self):
        return _FakeTarget(self.backend, 100)


@needs("triton")
def test_active_tileir_target_makes_it_ready(monkeypatch, capsys):
    from triton.runtime import driver

    monkeypatch.setattr(driver, "_active", _FakeDriver("tileir"))
    monkeypatch.setattr(check, "gpu", lambda: {"name": "NVIDIA B200", "capability": [10, 0], "error": None})
    monkeypatch.setenv("ENABLE_TILE", "1")
    code, report = _run_cli(capsys, "--strict")
    assert code == 0
    assert report["tileir_active"] is True and report["blackwell_gpu"] is True
    assert report["enable_tile"] == "1"
    assert "ENABLE_TILE=1" in report["recommendation"]


@needs("triton")
def test_enable_tile_with_standard_triton_says_it_has_no_effect(monkeypatch):
    from triton.runtime import driver

    monkeypatch.setattr(driver, "_active", _FakeDriver("cuda"))  # what an H200 with stock triton reports
    monkeypatch.setenv("ENABLE_TILE", "1")
    report = check.check()
    assert report["tileir_active"] is False
    assert "no effect" in report["recommendation"]


@pytest.mark.parametrize("text, release", [
    ("Cuda compilation tools, release 13.4, V13.4.92", (13, 4)),
    ("tileiras: release 13.1, V13.1.80", (13, 1)),
    ("garbage", None),
])
def test_parse_tileiras_release(text, release):
    assert envcheck.parse_tileiras_release(text) == release


@pytest.mark.parametrize("version, cc, supported", [
    ("13.1", [10, 0], True), ("13.1", [9, 0], False), ("13.3", [9, 0], True), ("13.1", [8, 6], False),
    ("13.2", [8, 6], True), ("13.4", [12, 0], True), ("13.4", [7, 5], False), (None, [9, 0], None),
    ("13.4", None, None),
])
def test_tileiras_supports_follows_the_release_table(version, cc, supported):
    assert check.tileiras_supports(version, cc) is supported


def test_tileiras_override_directory_is_searched_first(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_TILEIRAS_PATH", str(tmp_path))
    candidates = check.tileiras_candidates(None)
    assert candidates[0] == ("TRITON_TILEIRAS_PATH", tmp_path / "tileiras")
