"""``benchmarks/install_check.py`` judges a pip resolution of README's install (issue 43).

The recorded reports in ``tests/install_reports/`` are two real ``pip install --dry-run --report``
runs of ``.[gpu]`` on a CPU machine with only the package index, stripped to what the parser reads
(each package's name and version, torch's CUDA pins) and pip's "Collecting"/"Downloading"/"INFO" lines:
- ``backtracked``: the old extra (``cuda-toolkit[...]>=13.4``): pip walked torch 2.15 -> 2.10;
- ``resolved``: the extra as it is now: torch 2.15.0 at once (recorded 2026-12-05).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORTS = Path(__file__).resolve().parent / "install_reports"


def _load_check():
    spec = importlib.util.spec_from_file_location("install_check", ROOT / "benchmarks" / "install_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load_check()


def _recorded(name: str) -> tuple[dict, str]:
    report = json.loads((REPORTS / f"{name}.json").read_text(encoding="utf-8"))
    return report, (REPORTS / f"{name}.log").read_text(encoding="utf-8")


def test_the_backtracked_resolution_is_refused_for_both_reasons():
    report, log = _recorded("backtracked")
    found = check.problems(report, log, "2.11")
    assert any(p.startswith("pip backtracked: INFO: pip is looking at multiple versions of torch") for p in found)
    assert "pip backtracked: torch fetched at 8 versions: 2.15.0, 2.14.1, 2.14.0, 2.13.0, 2.12.1, 2.12.0, 2.11.0, " \
        "2.10.0" in found
    assert any("torch 2.10.0 is older than torch 2.11" in p for p in found)
    assert "torch 2.10.0 (CUDA 12.8.90)" in check.summary(report)


def test_the_current_resolution_passes():
    report, log = _recorded("resolved")
    assert check.problems(report, log, "2.11") == []
    assert check.summary(report).startswith("torch 2.15.0 (CUDA 13.2.2), cuda-tile 1.7.0, tileiras 13.4.92")


def test_a_dependency_swapped_for_torchs_pin_is_a_note_not_a_backtrack(capsys):
    # Today's real resolution: nvcc 13.4 asks for nvidia-cuda-runtime unpinned, pip takes 13.5, then
    # torch's cuda-toolkit==13.2.2 pins it to 13.2: one 2.5 MB candidate swapped, no torch walked.
    report, log = _recorded("resolved")
    assert check.backtracked(log) == [] and check.narrowed(log) == ["nvidia-cuda-runtime: 13.5.37, 13.2.86"]
    assert check.problems(report, log, "2.11") == []
    check.main(["--report", str(REPORTS / "resolved.json"), "--log", str(REPORTS / "resolved.log")])
    assert "note: narrowed to a pin met later: nvidia-cuda-runtime: 13.5.37, 13.2.86" in capsys.readouterr().out


def test_backtracking_is_seen_from_the_downloads_alone():
    # pip prints its "looking at multiple versions" line only once it rejects a torch it chose;
    # two torch releases fetched are already the walk issue 43 was about.
    log = ("Collecting torch (from x)\n  Downloading torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl (539 MB)\n"
           "  Downloading torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl.metadata (30 kB)\n"
           "  Downloading nvidia_nvvm-13.4.92-py3-none-manylinux2010_x86_64.whl (72 MB)\n"
           "  Using cached nvidia_nvvm-13.4.92-py3-none-manylinux2010_x86_64.whl (72 MB)\n")
    assert check.backtracked(log) == ["torch fetched at 2 versions: 2.15.0, 2.14.1"]
    assert check.problems({"install": [{"metadata": {"name": "torch", "version": "2.15.0"}},
                                       {"metadata": {"name": "nvidia-cuda-tileiras", "version": "13.4.92"}}]},
                          log, "2.11") == ["pip backtracked: torch fetched at 2 versions: 2.15.0, 2.14.1"]


def test_an_old_torch_and_a_pre_hopper_tileiras_are_refused():
    report = {"install": [{"metadata": {"name": "torch", "version": "2.11.0+cu130"}},
                          {"metadata": {"name": "nvidia_cuda_tileiras", "version": "13.2.51"}}]}
    assert check.problems(report, "", "2.11") == ["tileiras 13.2.51 cannot target Hopper (13.3 or newer can)"]
    assert check.problems(report, "", "2.12.1") == [
        "torch 2.11.0+cu130 is older than torch 2.12.1, which README says the figures were measured with",
        "tileiras 13.2.51 cannot target Hopper (13.3 or newer can)"]
    assert check.problems({"install": []}, "", "2.11") == [
        "torch is not in the resolution", "tileiras (nvidia-cuda-tileiras) is not in the resolution"]


def test_the_minimum_torch_is_the_one_readme_quotes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert check.measured_torch(readme) == "2.11"
    assert check.measured_torch("figures from some torch") is None


@pytest.mark.parametrize("name, code, last", [("backtracked", 1, "install_check: torch 2.10.0 is older"),
                                              ("resolved", 0, "ok: resolved at once, torch >= 2.11")])
def test_the_command_judges_a_recorded_report(name, code, last, capsys):
    rc = check.main(["--report", str(REPORTS / f"{name}.json"), "--log", str(REPORTS / f"{name}.log")])
    out = capsys.readouterr().out
    assert rc == code
    assert out.splitlines()[-1].startswith(last)


def test_the_command_says_why_it_cannot_run(tmp_path, capsys):
    (tmp_path / "README.md").write_text("no torch quoted here\n", encoding="utf-8")
    assert check.main(["--source", str(tmp_path), "--report", str(REPORTS / "resolved.json")]) == 2
    assert "pass --min-torch" in capsys.readouterr().err
    assert check.main(["--report", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
