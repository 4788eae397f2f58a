"""benchmarks/tilegym_slice.sh: a trimmed TileGym copy for a GPU host (a SIMULATED TileGym tree)."""
from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tilegym_slice.sh"


def _fake_tilegym(root: Path) -> Path:
    files = ["pyproject.toml", "src/tilegym/__init__.py", "src/tilegym/ops/cutile/rms_norm.py",
             "src/tilegym/ops/tilecpp/big.cpp", "src/tilegym/ops/cutile_rs/lib.rs", "src/tilegym/transformers/m.py",
             "src/tilegym/suites/liger/cutile/grpo_loss.py", "src/tilegym/kernel_inventory/launch.py",
             "src/tilegym/ops/cutile/__pycache__/rms_norm.cpython-312.pyc",
             "tests/__init__.py", "tests/common.py", "tests/config.py", "tests/conftest.py", "tests/ops/__init__.py",
             "tests/ops/test_rms_norm.py", "tests/ops/test_softmax.py",
             "tests/ops/activation/__init__.py", "tests/ops/activation/test_geglu.py", "tests/benchmark/bench.py"]
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    return root


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_slice_keeps_the_package_and_the_named_ops_tests_only(tmp_path):
    src = _fake_tilegym(tmp_path / "tilegym")
    dest = tmp_path / "out" / "slice"
    done = subprocess.run(["bash", str(SCRIPT), str(src), str(dest), "rms_norm", "geglu"],
                          capture_output=True, text=True, check=True)
    assert int(done.stdout.strip()) > 0  # the size in bytes
    assert _files(dest) == {
        "pyproject.toml", "src/tilegym/__init__.py", "src/tilegym/ops/cutile/rms_norm.py",
        "tests/__init__.py", "tests/common.py", "tests/config.py", "tests/conftest.py", "tests/ops/__init__.py",
        "tests/ops/test_rms_norm.py", "tests/ops/activation/__init__.py", "tests/ops/activation/test_geglu.py"}
    (dest / "stale").write_text("from an earlier slice")
    subprocess.run(["bash", str(SCRIPT), str(src), str(dest), "rms_norm"], capture_output=True, check=True)
    assert "stale" not in _files(dest) and "tests/ops/activation/test_geglu.py" not in _files(dest)


def test_an_op_without_tests_is_refused_and_nothing_is_written(tmp_path):
    src = _fake_tilegym(tmp_path / "tilegym")
    done = subprocess.run(["bash", str(SCRIPT), str(src), str(tmp_path / "slice"), "no_such_op"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "no tests/ops/**/test_no_such_op.py" in done.stderr
    assert not (tmp_path / "slice").exists()
