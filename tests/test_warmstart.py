"""A perf child started ahead of its turn (``child.warmstart``), on CPU with plain pytest children.

The guarantee: until the harness lets it go, the child runs no code of the repository (nothing of
the checkout is on its path), and once let go it runs exactly what ``python -m pytest`` would.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cutile_perf import bench
from cutile_perf.child import runner, warmstart

PY = sys.executable


# --- the pure parts --------------------------------------------------------------------------------


@pytest.mark.skipif(sys.version_info < (3, 11), reason="-P (no working directory on the path) is Python 3.11's")
def test_only_this_interpreter_running_pytest_can_start_ahead(tmp_path):
    assert warmstart.warm_argv([PY, "-m", "pytest", "-q", "tests"]) == [
        PY, "-P", "-m", "cutile_perf.child.warmstart", "-q", "tests"]
    assert warmstart.warm_argv(["pytest", "-q"]) is None
    assert warmstart.warm_argv(["bash", "-m", "pytest"]) is None
    assert warmstart.warm_argv([PY, "-m", "xdist"]) is None
    other = tmp_path / "python3"
    other.symlink_to("/bin/true")
    assert warmstart.warm_argv([str(other), "-m", "pytest"]) is None  # another interpreter


def test_python_3_10_never_starts_a_child_ahead(monkeypatch):
    monkeypatch.setattr(warmstart.sys, "version_info", (3, 10, 14))
    assert warmstart.warm_argv([PY, "-m", "pytest"]) is None


def test_the_early_path_leaves_out_the_checkout_and_every_entry_that_means_the_working_directory(tmp_path):
    checkout, other = tmp_path / "checkout", tmp_path / "site"
    (checkout / "src").mkdir(parents=True)
    other.mkdir()
    (tmp_path / "link").symlink_to(checkout / "src")  # a path outside that resolves inside
    value = os.pathsep.join([str(checkout / "src"), "", "relative/dir", str(other), str(tmp_path / "link"),
                             str(checkout)])
    early, late = warmstart.split_pythonpath(value, checkout)
    assert early == str(other)
    assert late == value


def test_a_module_the_checkout_would_shadow_is_found(tmp_path):
    (tmp_path / "numpy.py").write_text("")
    (tmp_path / "pluggy").mkdir()
    (tmp_path / "fast.cpython-312-x86_64-linux-gnu.so").write_text("")
    modules = {"numpy": object(), "pluggy": object(), "fast": object(), "torch": object(), "torch.nn": object()}
    assert warmstart.shadowed(modules, [str(tmp_path)]) == ["fast", "numpy", "pluggy"]


# --- a real child ------------------------------------------------------------------------------------

REPO_TEST = """\
import os
from pathlib import Path

import mypkg


def test_it():
    with Path(os.environ["MARK"]).open("a") as fh:
        fh.write(f"test {mypkg.WHERE}\\n")
"""


def _repo(root: Path, mark: Path) -> Path:
    """A repository whose package (under src/, on PYTHONPATH as a checkout's package roots are)
    writes a line to ``mark`` the moment it is imported."""
    repo = root / "repo"
    (repo / "src" / "mypkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "src" / "mypkg" / "__init__.py").write_text(
        "import os\nWHERE = 'src'\nwith open(os.environ['MARK'], 'a') as fh:\n    fh.write('imported\\n')\n")
    (repo / "conftest.py").write_text("import os\nwith open(os.environ['MARK'], 'a') as fh:\n"
                                      "    fh.write('conftest\\n')\n")
    (repo / "tests" / "test_repo.py").write_text(REPO_TEST)
    return repo


@contextlib.contextmanager
def _started_ahead(repo: Path, mark: Path, log: Path, site: Path | None = None, extra_env: dict | None = None):
    """Start the repository's tests ahead of their turn (the package root src/ on PYTHONPATH, as a
    checkout's is, then ``site``, a folder of 'installed' packages) and yield ``(start, done)`` once
    the child waits; on leaving, close the gate (a no-op after ``start.open()``) and wait for the
    child: ``done["result"]`` is its ``RunResult``, ``done["pid"]`` its process."""
    done: dict = {}
    path = [str(repo / "src"), *([str(site)] if site else [])]
    env = {"MARK": str(mark), "PYTHONPATH": os.pathsep.join(path), "PYTHONDONTWRITEBYTECODE": "1", **(extra_env or {})}
    start = runner.StartGate()

    def go():
        done["result"] = runner.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=repo,
                                    timeout_s=120, output_path=log, env_overrides=env, start=start,
                                    on_start=lambda pid: done.setdefault("pid", pid))

    thread = threading.Thread(target=go)
    thread.start()
    try:
        assert start.wait_ready(120, ended=lambda: not thread.is_alive())
        assert thread.is_alive(), log.read_text()  # it waits, having imported torch, cuda.tile, pytest
        yield start, done
    finally:
        start.close()
        thread.join(120)
        start.done()


def test_a_child_started_ahead_runs_no_repository_code_until_it_is_let_go(tmp_path):
    mark, log = tmp_path / "mark.txt", tmp_path / "child.log"
    repo = _repo(tmp_path, mark)
    with _started_ahead(repo, mark, log) as (start, done):
        time.sleep(0.5)
        assert not mark.exists(), mark.read_text()  # not the conftest, not the package
        # It waits in "/", not in the checkout: no empty or relative LD_LIBRARY_PATH or PATH entry
        # can reach the checkout's files before it is let go.
        assert os.readlink(f"/proc/{done['pid']}/cwd") == "/"
        start.open()
    result = done["result"]
    assert result.ok, log.read_text()
    # As `python -m pytest` would: the rootdir conftest, the package from src/ (whole PYTHONPATH back).
    assert mark.read_text().splitlines() == ["conftest", "imported", "test src"]
    assert "(started ahead of its turn)" in log.read_text().splitlines()[0]
    # Its log says how long it waited at the gate: it was ready, then let go half a second later.
    waited = re.search(r"let go after ([0-9.]+) s at the gate \(ready ([0-9.]+) s after", log.read_text())
    assert waited and float(waited[1]) >= 0.4 and float(waited[2]) > 0, log.read_text()


def test_a_cancelled_child_ends_without_running_anything_of_the_repository(tmp_path):
    mark, log = tmp_path / "mark.txt", tmp_path / "child.log"
    repo = _repo(tmp_path, mark)
    with _started_ahead(repo, mark, log) as (_, done):
        pass  # leaving closes the gate: cancelled
    assert done["result"].returncode == warmstart.CANCELLED
    assert not mark.exists()


def test_a_module_the_repository_shadows_is_imported_from_the_repository_as_in_a_fresh_child(tmp_path):
    """pytest imports pluggy before any test. A repository with its own ``pluggy.py`` at its root
    gets that one under ``python -m pytest``; the warm child had already imported the installed one,
    so it re-executes itself as the plain command and the repository's copy is used, as it would be."""
    mark, log = tmp_path / "mark.txt", tmp_path / "child.log"
    repo = _repo(tmp_path, mark)
    (repo / "pluggy.py").write_text(
        "import os, sys\n"
        "with open(os.environ['MARK'], 'a') as fh:\n    fh.write('shadow\\n')\n"
        "here = os.path.dirname(os.path.abspath(__file__))\n"
        "sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != here]\n"
        "del sys.modules['pluggy']\nimport pluggy as _real\nsys.modules['pluggy'] = _real\n")
    with _started_ahead(repo, mark, log) as (start, done):
        assert not mark.exists()
        start.open()
    assert done["result"].ok, log.read_text()
    assert mark.read_text().splitlines()[0] == "shadow"
    # It pays a whole start-up again, so its log says so and why.
    assert "the checkout provides pluggy: running as a fresh child instead" in log.read_text()


def test_a_repository_that_turns_warnings_into_errors_runs_as_under_python_dash_m_pytest(tmp_path):
    """The warm child imported this package before pytest; pytest, loading it as a plugin, would
    warn that it cannot rewrite its asserts, and ``filterwarnings = error`` makes that an error."""
    mark, log = tmp_path / "mark.txt", tmp_path / "child.log"
    repo = _repo(tmp_path, mark)
    (repo / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    with _started_ahead(repo, mark, log) as (start, done):
        start.open()
    assert done["result"].ok, log.read_text()[-2000:]
    assert mark.read_text().splitlines() == ["conftest", "imported", "test src"]


PROFILE_TEST = """\
import os
import time
from pathlib import Path

import torch
from torch import profiler


def test_profile():
    started = time.perf_counter()
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(4).add_(1)
    prof.events()
    with Path(os.environ["MARK"]).open("a") as fh:
        fh.write(f"{time.perf_counter() - started} {torch.cuda.is_initialized()}\\n")
"""


def _first_profile_s(env: dict, tmp_path: Path) -> float:
    """What a fresh process on this machine pays for its first CPU profiler session."""
    script = tmp_path / "fresh.py"
    script.write_text(PROFILE_TEST + "\ntest_profile()\n")
    mark = tmp_path / "fresh-mark.txt"
    import subprocess  # noqa: PLC0415

    subprocess.run([PY, str(script)], env={**os.environ, **env, "MARK": str(mark)}, check=True,
                   capture_output=True, timeout=120)
    return float(mark.read_text().split()[0])


def _profiling_child_started_ahead(tmp_path: Path) -> tuple[Path, str]:
    """A child started ahead of a repository whose test profiles once, let go and run to its end:
    (its mark file, its log)."""
    mark, log = tmp_path / "mark.txt", tmp_path / "child.log"
    repo = _repo(tmp_path, mark)
    (repo / "tests" / "test_repo.py").write_text(PROFILE_TEST)
    (repo / "conftest.py").write_text("")
    (repo / "src" / "mypkg" / "__init__.py").write_text("")
    with _started_ahead(repo, mark, log) as (start, done):
        start.open()
    assert done["result"].ok, log.read_text()[-2000:]
    return mark, log.read_text()


@pytest.mark.skipif(not bench.cuda_host(), reason=f"no {bench.profiler.NVIDIA_CONTROL_NODE}: the set-up runs on GPU hosts only")
def test_a_child_started_ahead_has_paid_the_profilers_set_up_without_a_cuda_context(tmp_path):
    """While it waits, the child runs one CPU-only profiler session (about 4.6 s on the H200 that
    each run's first witness paid after the gate). Its tests then find the profiler set up, and no
    CUDA context made. Without that step the test's session costs what a fresh process pays."""
    mark, log = _profiling_child_started_ahead(tmp_path)
    assert "profiler set up while waiting" in log
    seconds, cuda = mark.read_text().split()
    assert cuda == "False"
    fresh = _first_profile_s({"PYTHONDONTWRITEBYTECODE": "1"}, tmp_path)
    assert float(seconds) < fresh / 4, (seconds, fresh)


@pytest.mark.skipif(bench.cuda_host(), reason=f"{bench.profiler.NVIDIA_CONTROL_NODE} exists: a GPU host sets the profiler up")
def test_a_child_started_ahead_on_a_host_without_a_gpu_skips_the_profilers_set_up(tmp_path):
    """On a host without a GPU the set-up buys nothing but seconds of a core: the child waits
    without it, and its run still works."""
    _mark, log = _profiling_child_started_ahead(tmp_path)
    assert "let go after" in log and "profiler set up" not in log


# --- preloading what the baseline's tests imported ---------------------------------------------------


def test_installed_imports_are_the_top_level_modules_from_outside_the_checkout_in_import_order(tmp_path):
    checkout, site = tmp_path / "checkout", tmp_path / "site"
    modules = {
        "torch": f"{site}/torch/__init__.py",  # imported before the gate anyway
        "json": "/usr/lib/python3.12/json/__init__.py",  # the standard library
        "sympy": f"{site}/sympy/__init__.py", "sympy.core": f"{site}/sympy/core/__init__.py",
        "tilegym": f"{checkout}/src/tilegym/__init__.py",  # the repository's own code
        "tilegym.ops": f"{checkout}/src/tilegym/ops/__init__.py",
        "triton": f"{site}/triton/__init__.py",
        "cuda.tile": f"{site}/cuda/tile/__init__.py",  # "cuda" is a namespace package: no file
        "cutile_perf": f"{site}/cutile_perf/__init__.py",  # pytest loads it as a plugin after the gate
        "_private": f"{site}/_private.so",
        "scratch_mod": f"{tmp_path}/run/scratch/scratch_mod.py",  # written by the run itself
        "sitecustomize": f"{site}/sitecustomize.py",  # the interpreter ran it at start-up
        "transformers": f"{site}/transformers/__init__.py",
    }
    assert warmstart.installed_imports(modules, [checkout, tmp_path / "run"]) == ["sympy", "triton", "transformers"]


def test_the_cuda_driver_is_seen_in_the_memory_maps_and_its_runtime_is_not():
    driver = "7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05\n"
    runtime = "7f20-7f30 r-xp 00000000 08:01 43 /opt/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13\n"
    assert warmstart.driver_mapped(runtime + driver)
    assert not warmstart.driver_mapped(runtime + "7f40-7f50 rw-p 00000000 00:00 0 \n")


class _FakeDriver:
    """Stands in for libcuda: ``cuDeviceGetCount`` answers ``answer`` (3: not initialized)."""

    def __init__(self, answer: int) -> None:
        self.answer = answer

    def cuDeviceGetCount(self, _count):  # noqa: N802 - the driver's name
        return self.answer


@pytest.mark.parametrize(("answer", "touched"), [(3, False), (0, True)], ids=["not-initialized", "initialized"])
def test_a_driver_initialized_by_the_preloads_counts_as_near_the_gpu(monkeypatch, answer, touched):
    # On the H200 ``import torch`` maps libcuda before any preload (``driver_mapped`` cannot tell),
    # and leaves it uninitialized: a preload that calls cuInit (every context's first step) is seen.
    import ctypes

    monkeypatch.setattr(warmstart, "_driver_path", lambda maps=None: "/usr/lib/libcuda.so.1")
    monkeypatch.setattr(ctypes, "CDLL", lambda path: _FakeDriver(answer))
    assert warmstart.driver_initialized() is touched
    before = warmstart.Quiet(driver_mapped=True, driver_initialized=False, torch_cuda=False, threads=2)
    after = warmstart.Quiet.now()
    assert (warmstart.preload_problem(before, replace(after, threads=2)) is not None) is touched
    # initialized before the preloads: only the other checks are left
    assert warmstart.preload_problem(replace(before, driver_initialized=True), replace(after, threads=2)) is None


def test_a_preload_that_starts_a_thread_or_torch_s_cuda_is_a_problem():
    quiet = warmstart.Quiet(driver_mapped=True, driver_initialized=False, torch_cuda=False, threads=2)
    assert warmstart.preload_problem(quiet, quiet) is None
    assert warmstart.preload_problem(quiet, replace(quiet, threads=3)) == "1 thread(s) were started"
    assert warmstart.preload_problem(quiet, replace(quiet, torch_cuda=True)) == "torch's CUDA was initialized"
    assert warmstart.preload_problem(replace(quiet, driver_mapped=False), quiet) == "the CUDA driver was loaded"


def _site(root: Path, packages: dict[str, str]) -> Path:
    """A folder of 'installed' packages outside the repository: ``{name: its __init__.py}``."""
    site = root / "site"
    for name, code in packages.items():
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(code)
    return site


def _marking(name: str) -> str:
    return f"import os\nwith open(os.environ['MARK'], 'a') as fh:\n    fh.write('{name} imported\\n')\n"


def _run_ahead_with(repo: Path, mark: Path, log: Path, site: Path, preload: list[str], before_go):
    """Run the tests started ahead of their turn with CUTILE_PERF_PRELOAD set: returns the child's
    result and what ``before_go(pid)`` returned while it waited."""
    import json

    with _started_ahead(repo, mark, log, site, {"CUTILE_PERF_PRELOAD": json.dumps(preload)}) as (start, done):
        seen = before_go(done["pid"])
        start.open()
    return done["result"], seen


def test_a_child_started_ahead_imports_the_installed_preloads_while_it_waits_and_never_the_repository_s(tmp_path):
    """Red team: the preload list names the repository's own package too (``mypkg``, under src/):
    with nothing of the checkout on the path, it cannot be imported before the gate."""
    mark, log = tmp_path / "mark.txt", tmp_path / "child.log"
    repo = _repo(tmp_path, mark)
    site = _site(tmp_path, {"heavy": _marking("heavy")})
    result, waited = _run_ahead_with(repo, mark, log, site, ["heavy", "mypkg", "not_installed"],
                                     before_go=lambda pid: mark.read_text() if mark.exists() else "")
    assert waited == "heavy imported\n"  # while it waited: the installed one only
    assert result.ok, log.read_text()
    assert mark.read_text().splitlines() == ["heavy imported", "conftest", "imported", "test src"]
    assert "preloaded 1 installed module(s) the baseline's tests imported" in log.read_text()


def _a_library_named_like_the_cuda_driver(root: Path) -> Path | None:
    import shutil

    for lib in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6",
                "/usr/lib64/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6"):
        if Path(lib).exists():
            target = root / "fakedriver" / "libcuda.so.1"
            target.parent.mkdir()
            shutil.copyfile(lib, target)
            return target
    return None


def test_a_preload_that_loads_the_cuda_driver_is_undone_before_the_child_waits(tmp_path):
    """Red team: an installed module whose import loads the CUDA driver (the way to a CUDA context)
    must not sit in a child waiting beside a timed run: the child starts again without preloads and
    waits with no driver mapped. (A copy of libm named libcuda.so.1 stands in for the driver.)"""
    fake = _a_library_named_like_the_cuda_driver(tmp_path)
    if fake is None:
        pytest.skip("no libm.so.6 to stand in for the CUDA driver on this machine")
    mark, log = tmp_path / "mark.txt", tmp_path / "child.log"
    repo = _repo(tmp_path, mark)
    site = _site(tmp_path, {"gpuish": _marking("gpuish") + f"import ctypes\nctypes.CDLL({str(fake)!r})\n"})
    result, maps = _run_ahead_with(repo, mark, log, site, ["gpuish"],
                                   before_go=lambda pid: Path(f"/proc/{pid}/maps").read_text())
    assert not warmstart.driver_mapped(maps)  # what waited has no driver mapped
    assert "the CUDA driver was loaded; starting again without preloads" in log.read_text()
    assert result.ok, log.read_text()
    assert mark.read_text().splitlines() == ["gpuish imported", "conftest", "imported", "test src"]


def test_a_preload_that_starts_a_thread_is_undone_before_the_child_waits(tmp_path):
    """Red team: an installed module that starts a thread at import (a poller, a telemetry sender)
    would keep working while the child waits beside a timed run. The child starts again without
    preloads: what waits has no such thread."""
    mark, log = tmp_path / "mark.txt", tmp_path / "child.log"
    repo = _repo(tmp_path, mark)
    spinner = _marking("spinner") + "import threading, time\n" \
        "threading.Thread(target=lambda: [time.sleep(0.01) for _ in range(10**6)], daemon=True, name='spin').start()\n"
    site = _site(tmp_path, {"spinner": spinner})
    result, threads = _run_ahead_with(repo, mark, log, site, ["spinner"],
                                      before_go=lambda pid: len(list(Path(f"/proc/{pid}/task").iterdir())))
    assert "1 thread(s) were started; starting again without preloads" in log.read_text()
    # What waits is the process started again (exec ends every thread of the one before): no more
    # threads than a child that preloaded nothing.
    mark2, log2 = tmp_path / "mark2.txt", tmp_path / "child2.log"
    with _started_ahead(_repo(tmp_path / "plain", mark2), mark2, log2) as (start, done):
        plain = len(list(Path(f"/proc/{done['pid']}/task").iterdir()))
        start.open()
    assert threads <= plain, (threads, plain)
    assert result.ok, log.read_text()


def test_a_mapped_path_with_a_space_is_read_whole():
    """``/proc/<pid>/maps`` puts the path after five fields, and a path may hold spaces: read at
    its last space, the driver's library under such a folder would be missed."""
    maps = ("7f00-7f10 rw-s 00000000 00:05 91 /dev/nvidia-uvm\n"
            "7f10-7f20 r-xp 00000000 08:01 42 /opt/my drivers/libcuda.so.1\n"
            "7f20-7f30 rw-p 00000000 00:00 0 \n"
            "7f30-7f40 r--p 00000000 08:01 43 /usr/lib/libfoo.so (deleted)\n")
    assert warmstart.mapped_paths(maps) == ["/dev/nvidia-uvm", "/opt/my drivers/libcuda.so.1",
                                            "/usr/lib/libfoo.so (deleted)"]
    assert warmstart.driver_mapped(maps)
