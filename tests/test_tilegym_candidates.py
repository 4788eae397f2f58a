"""benchmarks/tilegym_candidates.py on the CPU, over a SIMULATED TileGym op module written here: every
kernel decorator gets the hint set and nothing else changes; the GPU run times what they do."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "tilegym_candidates.py"

# SIMULATED: the decorator forms TileGym's ops use (bare, with keywords, over two lines), one
# decorator that is not a kernel's, and a kernel method of a class.
OP = '''import cuda.tile as ct
import functools


@ct.kernel
def bare(x, TILE: ct.Constant[int]):
    pass


@ct.kernel(occupancy=4)
def tuned(x):
    pass


@ct.kernel(
    occupancy=1,
    opt_level=3,
)
def spread(x):
    pass


@functools.lru_cache
def helper():
    return 1


class Holder:
    @ct.kernel
    def method(x):
        pass
'''


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("tilegym_candidates", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decorators(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if line.strip().startswith("@")]


def test_every_kernel_gets_the_hints_and_nothing_else_changes(tool):
    text = tool.with_hints(OP, {"occupancy": 2, "num_ctas": 2})
    ast.parse(text)
    assert decorators(text) == ["@ct.kernel(occupancy=2, num_ctas=2)", "@ct.kernel(occupancy=2, num_ctas=2)",
                                "@ct.kernel(occupancy=2, opt_level=3, num_ctas=2)", "@functools.lru_cache",
                                "@ct.kernel(occupancy=2, num_ctas=2)"]
    assert "    @ct.kernel(occupancy=2, num_ctas=2)\n    def method" in text  # its indent kept
    # outside the decorators the module is the same, line for line
    strip = lambda s: [line for line in s.splitlines() if not line.strip().startswith(("@", "occupancy", "opt_level", ")"))]  # noqa: E731
    assert strip(text) == strip(OP)


def test_candidates_skip_hint_sets_that_change_nothing_and_keep_the_first_most(tool):
    only_occupancy_4 = "import cuda.tile as ct\n\n\n@ct.kernel(occupancy=4)\ndef k(x):\n    pass\n"
    made = tool.candidates(only_occupancy_4)
    assert "occupancy4" not in made and len(made) == len(tool.HINT_SETS) - 1
    assert list(tool.candidates(OP, most=3)) == ["occupancy1", "occupancy2", "occupancy4"]


def test_main_writes_one_module_per_candidate_and_refuses_an_op_without_a_kernel(tool, tmp_path, capsys):
    ops = tmp_path / "tilegym" / tool.OPS_DIR
    ops.mkdir(parents=True)
    (ops / "fake_op.py").write_text(OP)
    (ops / "no_kernel.py").write_text("def f():\n    pass\n")
    out = tmp_path / "cands"
    assert tool.main([str(tmp_path / "tilegym"), "--ops", "fake_op", "--out", str(out)]) == 0
    written = sorted(p.name for p in (out / "fake_op").iterdir())
    assert len(written) == len(tool.HINT_SETS) and "num_ctas2.py" in written
    assert tool.main([str(tmp_path / "tilegym"), "--ops", "no_kernel", "--out", str(out)]) == 2
    assert tool.main([str(tmp_path / "tilegym"), "--ops", "missing", "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"tilegym_candidates: {ops / 'no_kernel.py'} has no @ct.kernel",
                   f"tilegym_candidates: {ops / 'missing.py'} is not a file"]
