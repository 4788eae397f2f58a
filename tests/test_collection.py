"""The suite collects cleanly with only the base install: torch, cuda-tile and triton are optional extras.

A ``sitecustomize`` on PYTHONPATH hides the optional packages from a child pytest (every meta-path
finder is wrapped so that it finds none of them, as if they were not installed), and the child must
collect every test module without an error: each test that needs an extra skips with a reason
instead (``tests/optional_deps.py``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HIDDEN = ("torch", "cuda", "triton")

SITECUSTOMIZE = textwrap.dedent(f"""\
    import sys

    HIDDEN = {HIDDEN!r}


    class _Hide:
        # Wraps one meta-path finder so that it finds none of HIDDEN: a hidden package looks exactly
        # as if it were not installed (find_spec gives None, import raises ModuleNotFoundError).

        def __init__(self, finder):
            self._finder = finder

        def find_spec(self, fullname, path=None, target=None):
            if fullname.partition(".")[0] in HIDDEN:
                return None
            return self._finder.find_spec(fullname, path, target)

        def __getattr__(self, name):
            return getattr(self._finder, name)


    for _name in [m for m in sys.modules if m.partition(".")[0] in HIDDEN]:
        del sys.modules[_name]
    sys.meta_path[:] = [_Hide(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
    sys.cutile_perf_hidden = HIDDEN  # so that a test can tell the hook ran
    """)

PROBE = textwrap.dedent("""\
    import importlib, importlib.util, sys
    assert sys.cutile_perf_hidden, "the sitecustomize hook did not run"
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit(f"{name} imported")
        if "." not in name:
            assert importlib.util.find_spec(name) is None, name
    print("hidden")
    """)


@pytest.fixture
def hidden_env(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH", "")) if p)
    return env


def test_the_hook_hides_every_optional_package(hidden_env):
    proc = subprocess.run([sys.executable, "-c", PROBE, *HIDDEN, "cuda.tile", "triton.runtime"], capture_output=True,
                          text=True, env=hidden_env, cwd=REPO, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "hidden", proc.stderr[-2000:]


def test_suite_collects_without_torch_cuda_or_triton(hidden_env):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", "-p", "no:xdist", "tests"],
        capture_output=True, text=True, env=hidden_env, cwd=REPO, timeout=120)
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if line.startswith("ERROR") or " ERROR " in line]
    assert proc.returncode in (0, 5), out[-4000:]
    assert not errors, "\n".join(errors)
    assert "error" not in out.splitlines()[-1].lower(), out[-4000:]
    assert "tests/test_collection.py::test_suite_collects_without_torch_cuda_or_triton" in out
