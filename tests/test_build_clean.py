"""Building the sdist and the wheel prints no warning, and the metadata carries an SPDX license.

Regression (issue 43): `project.license` as a TOML table is deprecated by setuptools, and excluding
the importable data folders (`cutile_perf.data`, `cutile_perf.templates`) from package discovery made
setuptools warn once per folder that a package would be ignored.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_wheel import ROOT, _source_copy

# setuptools' own words for a problem with the project's configuration, as `python -m build` prints
# them ("WARNING ..."), as warnings.warn does ("SetuptoolsDeprecationWarning: ...") or as distutils does.
WARNING_LINE = re.compile(r"^(WARNING\b|warning:|.*\b\w*Warning:)")
# Said of the environment, not of the project: PYTHONDONTWRITEBYTECODE set in the caller's shell.
_NOT_OURS = ("byte-compiling is disabled",)

# Both builds in one process, with the build backend the project names: what `python -m build` runs.
_BUILD = """
import sys
from setuptools import build_meta
out = sys.argv[1]
print("SDIST", build_meta.build_sdist(out))
print("WHEEL", build_meta.build_wheel(out))
"""


def build_warnings(output: str) -> list[str]:
    """The lines of a build's output that warn about the project."""
    return [line.strip() for line in output.splitlines()
            if WARNING_LINE.match(line.strip()) and not any(n in line for n in _NOT_OURS)]


def test_build_warnings_are_found_in_setuptools_output():
    sample = ("running egg_info\n"
              "WARNING `project.license` as a TOML table is deprecated\n"
              "/x/setuptools/config/_apply_pyprojecttoml.py:82: SetuptoolsDeprecationWarning: `project.license` ...\n"
              "warning: build_py: byte-compiling is disabled, skipping.\n"
              "writing manifest file 'SOURCES.txt'\n")
    assert build_warnings(sample) == ["WARNING `project.license` as a TOML table is deprecated",
                                      "/x/setuptools/config/_apply_pyprojecttoml.py:82: SetuptoolsDeprecationWarning: "
                                      "`project.license` ..."]


def _setuptools_version() -> tuple[int, ...]:
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return (0,)
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


@pytest.mark.slow
def test_sdist_and_wheel_build_without_a_warning(tmp_path):
    if _setuptools_version() < (77,):  # what pyproject.toml's build-system asks for (SPDX license)
        pytest.skip("setuptools >= 77 is not installed here (python -m build would fetch it)")
    source = _source_copy(tmp_path / "src")
    out = tmp_path / "dist"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONWARNINGS"] = "always"  # every warning is printed, not only its first time
    result = subprocess.run([sys.executable, "-c", _BUILD, str(out)], cwd=source, env=env,
                            capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert build_warnings(output) == [], output[-6000:]

    wheel = next(out.glob("cutile_perf-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        names = zf.namelist()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    # Discovering the data folders as packages changed no file of the wheel: the skill, the
    # templates and the bundled kernels are in it, and nothing beside them.
    assert "cutile_perf/data/SKILL.md" in names and any(n.startswith("cutile_perf/templates/") for n in names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert sorted(n for n in names if n.startswith("cutile_perf/data/kernels/src/")) == sorted(
        "cutile_perf/data/kernels/" + p.relative_to(ROOT / "examples/kernels").as_posix()
        for p in (ROOT / "examples/kernels/src").rglob("*.py") if "__pycache__" not in p.parts)
