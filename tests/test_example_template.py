"""`cutile-perf example` and `cutile-perf template`: what the installed skill uses instead of links
into examples/ and templates/, which do not exist in the repository the skill is installed in."""
from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path

import pytest
import yaml

from cutile_perf.skill import assets
from cutile_perf.cli import main
from cutile_perf.loop.demo import load_steps
from cutile_perf.commands.example import pick_step
from cutile_perf.commands.template import EXAMPLES, KIND_ALIASES, resolve_kind
from cutile_perf.errors import EXIT_REFUSED, EXIT_USAGE, UsageError

SUITE = Path(__file__).resolve().parents[1] / "examples" / "kernels"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_assets_find_the_checkout_suite_and_skill():
    assert assets.kernel_suite().resolve() == SUITE.resolve()
    assert (assets.skill_source() / "SKILL.md").read_bytes() == (SUITE.parents[1] / "SKILL.md").read_bytes()


# --- example ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("wanted", ["06", "6", "06-persistent-grid", "06-persistent-grid.py",
                                    "persistent grid"])
def test_pick_step_by_number_file_or_name(wanted):
    _, steps = load_steps(SUITE / "optimizations/rms_norm/steps.yaml")
    assert pick_step(steps, wanted).file.name == "06-persistent-grid.py"


def test_pick_step_unknown_lists_the_choices():
    _, steps = load_steps(SUITE / "optimizations/rms_norm/steps.yaml")
    with pytest.raises(UsageError, match="no such prepared step") as info:
        pick_step(steps, "42")
    assert "06 (06-persistent-grid)" in str(info.value)


def test_example_list_names_every_op_and_step(capsys):
    code, out, _ = run(capsys, "example", "list", "--json")
    assert code == 0
    ops = {o["op"]: o for o in json.loads(out)["ops"]}
    assert set(ops) == {p.parent.name for p in SUITE.glob("optimizations/*/steps.yaml")}
    raw = yaml.safe_load((SUITE / "optimizations/rms_norm/steps.yaml").read_text())
    assert [s["name"] for s in ops["rms_norm"]["steps"]] == [s["name"] for s in raw["steps"]]
    assert ops["rms_norm"]["kernel_file"] == raw["kernel_file"]
    code, out, _ = run(capsys, "example", "list")
    assert "rms_norm: src/tilesuite/ops/cutile/rms_norm.py" in out and "  06 persistent grid" in out


def test_example_show_prints_the_file_on_stdout_and_the_step_on_stderr(capsys):
    code, out, err = run(capsys, "example", "show", "rmsnorm", "--step", "06")
    assert code == 0
    assert out == (SUITE / "optimizations/rms_norm/06-persistent-grid.py").read_text()
    assert "persistent grid" in err and "why:" in err and "changes:" in err

    code, out, err = run(capsys, "example", "show", "rms_norm")
    assert out == (SUITE / "src/tilesuite/ops/cutile/rms_norm.py").read_text()
    assert "--step NN" in err and "07 narrow 64-column loop" in err

    code, out, _ = run(capsys, "example", "show", "softmax", "--test")
    assert out == (SUITE / "tests/ops/test_softmax.py").read_text()

    code, out, _ = run(capsys, "example", "show", "fmha", "--step", "3", "--json")
    data = json.loads(out)
    assert data["op"] == "attention" and data["step"]["file"] == "03-hopper-tiles.py"
    assert data["source"] == (SUITE / "optimizations/attention/03-hopper-tiles.py").read_text()


@pytest.mark.parametrize("args", [
    ("example", "show"),                                  # no op
    ("example", "list", "rms_norm"),                      # list takes no op
    ("example", "list", "--step", "04"),                  # --step only with show
    ("example", "show", "rms_norm", "--step", "1", "--test"),
    ("example", "show", "conv3d"),
    ("example", "show", "rms_norm", "--step", "99"),
    ("example", "copy"),                                  # no --dest
])
def test_example_bad_input_is_a_usage_error(capsys, args):
    code, _, err = run(capsys, *args)
    assert code == EXIT_USAGE and err.count("\n") == 1, err


def test_example_copy_makes_a_clean_repo_without_the_prepared_steps(capsys, tmp_path):
    from fixtures_repo import git

    dest = tmp_path / "kernels"
    code, out, _ = run(capsys, "example", "copy", "--dest", str(dest), "--json")
    assert code == 0, out
    assert (dest / "src/tilesuite/ops/cutile/rms_norm.py").read_text() == \
        (SUITE / "src/tilesuite/ops/cutile/rms_norm.py").read_text()
    assert not (dest / "optimizations").exists()
    assert git(dest, "status", "--porcelain").strip() == ""
    assert len(git(dest, "log", "--format=%H").split()) == 1
    # An existing, non-empty directory is the user's: refused, untouched.
    (dest / "mine.txt").write_text("keep\n")
    code, _, err = run(capsys, "example", "copy", "--dest", str(dest))
    assert code == EXIT_REFUSED and (dest / "mine.txt").read_text() == "keep\n"


# --- template --------------------------------------------------------------------------------------


class FakeKernel:
    def __init__(self, hints=None):
        self.hints = hints or {}

    def replace_hints(self, **hints):
        return FakeKernel(hints)


def _load_with_fakes(source: str, kernel_module: str, kernel_name: str, monkeypatch) -> types.ModuleType:
    """Import a generated module against a fake kernel module; fake its search and launch."""
    fake = types.ModuleType(kernel_module)
    setattr(fake, kernel_name, FakeKernel())
    monkeypatch.setitem(sys.modules, kernel_module, fake)
    module = types.ModuleType("generated")
    exec(compile(source, "<generated>", "exec"), module.__dict__)
    launches = []
    module._search = lambda configs, stream, grid_fn, args_fn: ([grid_fn(c) for c in configs],
                                                                 [args_fn(c) for c in configs], configs[-1])[-1]
    module._launch = lambda stream, grid, kernel, args: launches.append((grid, kernel.hints, args))
    module.launches = launches
    return module


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_each_worked_template_renders_and_runs_against_a_fake_kernel(kind, capsys, monkeypatch):
    # The defaults are a worked example: they must render, import and launch, or the agent copies a broken one.
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("DISABLE_AUTOTUNE", raising=False)
    monkeypatch.delenv("TILEGYM_DISABLE_AUTOTUNE", raising=False)
    code, out, _ = run(capsys, "template", "autotune", "--kind", kind)
    assert code == 0
    fields = EXAMPLES[kind]
    module = _load_with_fakes(out, fields["kernel_module"], fields["kernel_name"], monkeypatch)
    inputs = {"x": torch.zeros(8, 16), "weight": torch.ones(16), "out": torch.zeros(8, 16), "eps": 1e-6,
              "tile_n": 16, "a": torch.zeros(256, 64), "b": torch.zeros(64, 512), "c": torch.zeros(256, 512),
              "q": torch.zeros(4, 8), "cos": torch.ones(8), "sin": torch.zeros(8)}
    launch = getattr(module, f"{fields['op_name']}_launch")
    cfg = launch(0, *[inputs[p] for p in fields["params"]])
    assert vars(cfg) == fields["configs"][-1]  # the fake search picks the last config
    assert len(module.launches) == 1 and all(isinstance(g, int) and g > 0 for g in module.launches[0][0])


def test_template_aliases_and_overrides(capsys, tmp_path):
    assert resolve_kind("matmul") == "tile_search" and resolve_kind("RMS-Norm") == "occupancy"
    assert set(KIND_ALIASES.values()) <= set(EXAMPLES)
    target = tmp_path / "tuned.py"
    code, out, _ = run(capsys, "template", "autotune", "--kind", "occupancy", "--op", "scale",
                       "--kernel-module", "pkg.k", "--kernel-name", "scale_kernel", "--params", "x,n",
                       "--grid", "(n,)", "--args", "(x, n)", "--key", "x.shape",
                       "--configs", '[{"occupancy": 2}, {"occupancy": 4}]', "--output", str(target))
    assert code == 0 and str(target) in out
    source = target.read_text()
    ast.parse(source)
    assert "from pkg.k import scale_kernel" in source and "def scale_launch(stream, x, n):" in source
    assert "_FIXED = _CONFIGS[0]" in source  # --fixed defaults to the first config
    code, _, err = run(capsys, "template", "autotune", "--kind", "occupancy", "--output", str(target))
    assert code == EXIT_REFUSED and target.read_text() == source  # never overwrites


@pytest.mark.parametrize("args", [
    ("--kind", "conv"),
    ("--kind", "occupancy", "--configs", "[{occupancy: 2}]"),
    ("--kind", "occupancy", "--params", "x,1y"),
    ("--kind", "occupancy", "--fixed", '{"occupancy": 3}'),
    ("--kind", "split_buffer", "--inplace", "zz"),
])
def test_template_bad_input_is_a_usage_error(capsys, args):
    code, _, err = run(capsys, "template", "autotune", *args)
    assert code == EXIT_USAGE and err.count("\n") == 1, err


def test_withheld_ops_steps_are_refused_by_show_and_demo(monkeypatch, capsys):
    from cutile_perf.cli import main

    monkeypatch.setenv("CUTILE_PERF_WITHHOLD_EXAMPLES", "rms_norm, layer_norm")
    assert main(["example", "show", "rms_norm", "--step", "1"]) == 3
    assert "withheld in this evaluation" in capsys.readouterr().err
    assert main(["demo", "--kernel", "rmsnorm"]) == 3  # refused before any GPU check or copy
    assert "withheld" in capsys.readouterr().err
    assert main(["example", "show", "softmax", "--step", "1"]) == 0
