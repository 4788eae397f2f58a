"""A wheel built from the project carries the skill, the templates and the bundled kernels, and
`install-skill`, `example`, `template` and the demo's file finding work from it, with no checkout.

Regression (issue 10): from a non-editable install, `install-skill` and `demo` failed with
"SKILL.md not found", because they looked for the files next to a checkout.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "kernels"


def _source_copy(dest: Path) -> Path:
    """The files a clean checkout has (tracked plus untracked-not-ignored), symlinks kept as links,
    so the build sees what CI sees and writes its build/ and egg-info outside the real checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, cannot list its files: {listed.stderr.strip()}")
    for rel in filter(None, listed.stdout.split("\0")):
        src, target = ROOT / rel, dest / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, target)
    return dest


def _build_wheel(source: Path, out: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)]
    try:
        # Read, not imported: importing setuptools here would fight whatever imported distutils.
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        version = "0"  # pip fetches the build backend into an isolated environment
    # setuptools >= 70.1 builds wheels itself: build here, offline, without an isolated env.
    if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) >= (70, 1):
        cmd.insert(5, "--no-build-isolation")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    wheels = list(out.glob("cutile_perf-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The wheel installed with ``pip install --target`` (dependencies come from this interpreter)."""
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed in this interpreter")
    base = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(_source_copy(base / "src"), base / "dist")
    site = base / "site"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                             str(wheel)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    work = base / "work"  # cwd of every run: no checkout on sys.path
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(site)
    return {"wheel": wheel, "site": site, "work": work, "env": env}


def _run(installed: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *args], cwd=installed["work"], env=installed["env"],
                            capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    out = _run(installed, "-c", "import cutile_perf, cutile_perf.skill.assets as a; print(cutile_perf.__file__); "
                                "print(a.skill_source()); print(a.kernel_suite())").stdout.split()
    assert all(Path(p).resolve().is_relative_to(installed["site"].resolve()) for p in out), out


def test_install_skill_from_the_wheel(installed, tmp_path):
    from fixtures_repo import git

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    result = _run(installed, "-m", "cutile_perf", "install-skill", "--target", str(repo), "--json")
    data = json.loads(result.stdout)
    dest = Path(data["installed"][0]["path"])
    assert (dest / "SKILL.md").read_bytes() == (ROOT / "SKILL.md").read_bytes()
    assert sorted(p.name for p in (dest / "references").glob("*.md")) == \
        sorted(p.name for p in (ROOT / "references").glob("*.md"))
    assert git(repo, "status", "--porcelain").strip() == ""


def test_example_and_template_from_the_wheel(installed):
    shown = _run(installed, "-m", "cutile_perf", "example", "show", "rms_norm").stdout
    assert shown == (SUITE / "src/tilesuite/ops/cutile/rms_norm.py").read_text()
    step = _run(installed, "-m", "cutile_perf", "example", "show", "matmul", "--step", "03").stdout
    assert step == (SUITE / "optimizations/matmul/03-occupancy-2.py").read_text()
    module = _run(installed, "-m", "cutile_perf", "template", "autotune", "--kind", "matmul").stdout
    assert "def matmul_launch(stream, a, b, c):" in module


def test_demo_finds_its_kernels_and_steps_in_the_wheel(installed):
    # Only the file finding: the demo itself needs a GPU.
    code = ("from cutile_perf.skill import assets; from cutile_perf.loop import demo; s = assets.kernel_suite(); "
            "ops = demo.available_ops(s); kf, steps = demo.load_steps(s / 'optimizations/rms_norm/steps.yaml'); "
            "print(ops); print((s / kf).is_file(), len(steps), demo.default_dest().name)")
    lines = _run(installed, "-c", code).stdout.splitlines()
    assert lines[0] == str(sorted(p.parent.name for p in SUITE.glob("optimizations/*/steps.yaml")))
    assert lines[1] == f"True {len(list((SUITE / 'optimizations/rms_norm').glob('0*.py')))} cutile-perf-demo"
