"""The installed-code bytecode the harness compiles once and every boxed child reads (``child.bytecode``).

The red-team test that a child cannot write to it is in ``test_redteam.py``
(``test_bytecode_planted_in_the_shared_prefix_never_reaches_the_next_child``).
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cutile_perf.child import bytecode


@pytest.fixture(autouse=True)
def own_temp_folder(tmp_path, monkeypatch):
    """Each test gets its own per-user folder (it lives in the temp folder)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.delenv("CUTILE_PERF_INSTALLED_BYTECODE", raising=False)
    return temp


def pyc_in(prefix: Path, source: str) -> Path:
    """Where Python looks for ``source``'s bytecode under ``prefix`` (PYTHONPYCACHEPREFIX)."""
    src = Path(source)
    return prefix.joinpath(*src.parent.parts[1:], f"{src.stem}.{sys.implementation.cache_tag}.pyc")


def installed_package(tmp_path: Path, monkeypatch, name: str = "fakeinstalled") -> Path:
    """A package on the harness's PYTHONPATH, as an installed one would be found."""
    site = tmp_path / "site"
    (site / name).mkdir(parents=True)
    init = site / name / "__init__.py"
    init.write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    return init


def test_prepare_compiles_the_modules_into_the_folder_once(tmp_path, monkeypatch, own_temp_folder):
    init = installed_package(tmp_path, monkeypatch)
    prefix, why = bytecode.prepare(["json", "fakeinstalled"])
    assert why == bytecode.FILLED_NOW
    assert prefix == bytecode.folder() and prefix.is_relative_to(own_temp_folder)
    assert pyc_in(prefix, importlib.import_module("json").__file__).is_file()
    assert pyc_in(prefix, str(init)).is_file()
    marker = json.loads((prefix / bytecode.MARKER).read_text())
    assert marker["python"] == sys.executable and set(marker["modules"]) == {"json", "fakeinstalled"}

    def no_second_fill(*args, **kwargs):
        raise AssertionError("filled again although nothing changed")

    monkeypatch.setattr(subprocess, "run", no_second_fill)
    assert bytecode.prepare(["json"]) == (prefix, "filled earlier")


def test_a_changed_module_file_or_a_new_module_fills_it_again_keeping_the_others(tmp_path, monkeypatch):
    init = installed_package(tmp_path, monkeypatch)
    prefix, _ = bytecode.prepare(["fakeinstalled"])
    assert bytecode.is_filled(prefix, ["fakeinstalled"])
    init.write_text("VALUE = 22\n")  # an upgrade: another size
    assert not bytecode.is_filled(prefix, ["fakeinstalled"])
    assert bytecode.prepare(["fakeinstalled"])[1] == bytecode.FILLED_NOW
    assert bytecode.prepare(["json"])[1] == bytecode.FILLED_NOW  # a module no command asked for yet
    assert set(json.loads((prefix / bytecode.MARKER).read_text())["modules"]) == {"fakeinstalled", "json"}


def test_the_filling_process_runs_nothing_from_the_working_folder(tmp_path, monkeypatch):
    """``-P`` and an empty working folder: a module that only the harness's working folder holds
    (a repository's file) is not imported, and is recorded as not importable."""
    here = tmp_path / "repo"
    here.mkdir()
    (here / "onlyinrepo.py").write_text("raise SystemExit('repository code ran in the filling process')\n")
    monkeypatch.chdir(here)
    prefix, why = bytecode.prepare(["onlyinrepo", "json"])
    assert why == bytecode.FILLED_NOW
    assert json.loads((prefix / bytecode.MARKER).read_text())["modules"]["onlyinrepo"] is None
    assert not pyc_in(prefix, str(here / "onlyinrepo.py")).exists()


def test_the_filling_process_sees_no_gpu_and_no_start_up_hooks(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "hook.py"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = bytecode.filler_env(tmp_path / "prefix", str(tmp_path))
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "prefix")
    assert "PYTHONSTARTUP" not in env and "PYTHONDONTWRITEBYTECODE" not in env


def test_switched_off_or_failing_it_says_why_and_gives_no_folder(monkeypatch):
    monkeypatch.setenv("CUTILE_PERF_INSTALLED_BYTECODE", "0")
    assert bytecode.prepare(["json"]) == (None, "off (CUTILE_PERF_INSTALLED_BYTECODE=0)")
    monkeypatch.setenv("CUTILE_PERF_INSTALLED_BYTECODE", "1")
    prefix, why = bytecode.prepare(["json"], timeout_s=0.001)
    assert prefix is None and why.startswith("filling failed")


# --- through the loop (simulated repository, boxed children) --------------------------------------

# The candidate's module, at import, writes its process's bytecode prefix into its perf log.
def _settings_to_log() -> str:
    from test_prestart_perf import TO_PERF_LOG

    return TO_PERF_LOG + '\nimport sys as _sys\n_to_perf_log(f"\\nBYTECODE-PREFIX {_sys.pycache_prefix}\\n")\n'


def _prefixes(runs: Path, seen: set[Path]) -> set[str]:
    found = set()
    for log in sorted(runs.glob("*-perf.log")):
        if log in seen:
            continue
        seen.add(log)
        found |= {line.split(" ", 1)[1] for line in log.read_text().splitlines() if line.startswith("BYTECODE-PREFIX ")}
    return found


@pytest.mark.slow
def test_boxed_children_of_a_try_read_the_folder_and_verifys_children_do_not(tmp_path, own_temp_folder):
    """A ``try``'s boxed children run with the shared folder as their bytecode prefix; ``verify``,
    which trusts nothing it did not build from the commits, gives its children none."""
    from fixtures_repo import build_tilegym_like_repo, edit_kernel
    from redteam_helpers import append_to_kernel, call, start_session

    from cutile_perf.child import box

    if box.available() is not None:
        pytest.skip(f"no box here: {box.available()}")
    repo = build_tilegym_like_repo(tmp_path)
    start_session(repo)
    runs, seen = repo / "sandbox" / "runs", set()
    _prefixes(runs, seen)
    edit_kernel(repo, latency={"256x1024": 0.5, "4096x1024": 1.0})
    append_to_kernel(repo, _settings_to_log())
    code, data, _ = call(repo, "try", "twice as fast, and says its bytecode prefix")
    assert code == 0 and data["decision"] == "keep", data
    assert _prefixes(runs, seen) == {str(bytecode.folder())}
    code, data, _ = call(repo, "verify")
    assert data.get("verified") is not None, data
    assert _prefixes(runs, seen) == {"None"}


def test_a_folder_with_the_first_modules_is_used_at_once_and_the_rest_compiled_beside(tmp_path, monkeypatch):
    """The first ``try`` after a baseline: what every child imports first is there, the preloads
    the baseline learnt are not. The runner gives its children the folder at once and compiles the
    rest in the background, finished before any run is timed (``StageRunner.run`` calls
    ``_finish_filling``) and on the row."""
    from cutile_perf.child import warmstart
    from cutile_perf.loop.stages import StageRunner

    installed_package(tmp_path, monkeypatch)
    prefix, _ = bytecode.prepare(warmstart.WARM_MODULES)
    assert bytecode.partly_filled(warmstart.WARM_MODULES, warmstart.WARM_MODULES) is None  # nothing to add
    assert bytecode.partly_filled(warmstart.WARM_MODULES, [*warmstart.WARM_MODULES, "fakeinstalled"]) == prefix

    runner = StageRunner.__new__(StageRunner)  # only what the bytecode steps touch
    runner.preload, runner.installed_bytecode, runner._bytecode_note, runner._filling = ("fakeinstalled",), None, {}, None
    runner.dropped_compiled = []
    runner._prepare_installed_bytecode()
    assert runner.installed_bytecode == prefix and runner._filling is not None
    runner._finish_filling()
    assert runner._filling is None and bytecode.is_filled(prefix, [*warmstart.WARM_MODULES, "fakeinstalled"])
    assert set(runner.row_fields()) == {"installed_bytecode_s"}
