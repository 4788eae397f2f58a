"""The suite collects cleanly with only the base install: torch, cuda-tile and triton are optional extras.

A ``sitecustomize`` on PYTHONPATH hides the optional packages from a child pytest (a meta-path finder
refuses them, as if they were not installed), and the child must collect every test module without
an error: each test that needs an extra skips with a reason instead (``tests/optional_deps.py``).
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
        '''Refuses the optional packages, as if no extra were installed.'''

        def find_spec(self, fullname, path=None, target=None):
            if fullname.partition(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {{fullname!r}} (hidden by test_collection)",
                                          name=fullname)
            return None


    for _name in [m for m in sys.modules if m.partition(".")[0] in HIDDEN]:
        del sys.modules[_name]
    sys.meta_path.insert(0, _Hide())
    """)


@pytest.fixture
def hidden_env(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH", "")) if p)
    return env


def test_the_hook_hides_every_optional_package(hidden_env):
    for name in (*HIDDEN, "cuda.tile", "triton.runtime"):
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True,
                              env=hidden_env, cwd=REPO, timeout=60)
        assert proc.returncode == 1 and "hidden by test_collection" in proc.stderr, (name, proc.stderr[-500:])


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
