"""Generated tune-once/cache/launch code: renders, compiles, runs on CPU with fake search and launch."""
from __future__ import annotations

import types

import pytest
from optional_deps import needs

try:
    import torch
except ImportError:  # the rendering tests need no torch; the three that launch on tensors carry @needs
    torch = None

from cutile_perf.errors import UsageError
from cutile_perf.tune.codegen import render
from cutile_perf.tune.config import Config


def load(source: str, name: str = "generated_op") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


class FakeKernel:
    def __init__(self, hints=None):
        self.hints = hints or {}
        self.replaced = 0

    def replace_hints(self, **hints):
        self.replaced += 1
        return FakeKernel(hints)


def wire(module, best):
    """Fake the two cuTile calls of a generated module: search picks ``best``, launch adds 1 in place."""
    calls = {"search": [], "launch": []}

    def fake_search(configs, stream, grid_fn, args_fn):
        for cfg in configs:  # what exhaustive_search does: launch every config with args_fn(cfg)
            module._launch(stream, grid_fn(cfg), module.k, args_fn(cfg))
        calls["search"].append([vars(c) for c in configs])
        return next(c for c in configs if vars(c) == best)

    real_launch = []

    def fake_launch(stream, grid, kernel, args):
        args[0].add_(1)
        real_launch.append((grid, kernel.hints))

    module._search, module._launch = fake_search, fake_launch
    calls["launch"] = real_launch
    return calls


COMMON = dict(op_name="scale", kernel_module="fake_kernels", kernel_name="k", params=["x", "n"],
              grid="(n // 4 * cfg.occupancy,)", args="(x, n)", key="(tuple(x.shape), x.dtype)")


@pytest.fixture(autouse=True)
def fake_kernel_module(monkeypatch):
    import sys

    mod = types.ModuleType("fake_kernels")
    mod.k = FakeKernel()
    monkeypatch.setitem(sys.modules, "fake_kernels", mod)
    return mod


@needs("torch")
def test_occupancy_template_tunes_once_then_launches_from_cache(monkeypatch):
    monkeypatch.delenv("DISABLE_AUTOTUNE", raising=False)
    src = render("occupancy", configs=[{"occupancy": o} for o in (1, 2, 4, 8)], fixed={"occupancy": 1}, **COMMON)
    mod = load(src)
    calls = wire(mod, {"occupancy": 4})
    x = torch.zeros(8)
    for _ in range(3):
        assert vars(mod.scale_launch(0, x, 8)) == {"occupancy": 4}
    assert len(calls["search"]) == 1
    assert mod.k.replaced == 1  # replace_hints once per key, not per call
    assert calls["launch"][-1] == ((8,), {"occupancy": 4})


@needs("torch")
def test_disable_autotune_launches_the_fixed_config(monkeypatch):
    monkeypatch.setenv("TILEGYM_DISABLE_AUTOTUNE", "1")
    mod = load(render("occupancy", configs=[{"occupancy": o} for o in (1, 2)], fixed={"occupancy": 2}, **COMMON))
    calls = wire(mod, {"occupancy": 1})
    assert vars(mod.scale_launch(0, torch.zeros(8), 8)) == {"occupancy": 2}
    assert calls["search"] == []


@needs("torch")
def test_split_buffer_template_keeps_the_input_intact(monkeypatch):
    monkeypatch.delenv("DISABLE_AUTOTUNE", raising=False)
    src = render("split_buffer", configs=[{"occupancy": o} for o in (1, 2, 4)], fixed={"occupancy": 1},
                 inplace=["x"], **COMMON)
    assert "x_search = _scratch(x)" in src
    mod = load(src)
    calls = wire(mod, {"occupancy": 2})
    x = torch.zeros(8)
    mod.scale_launch(0, x, 8)
    assert torch.equal(x, torch.ones(8))  # 3 search launches hit the scratch copy, 1 real launch hit x
    assert len(calls["launch"]) == 4


def test_tile_search_template_renders_tile_fields():
    src = render("tile_search", configs=[{"TILE_M": 128, "num_ctas": 1}, {"TILE_M": 64, "num_ctas": 2}],
                 fixed={"TILE_M": 64, "num_ctas": 2}, **{**COMMON, "args": "(x, n, cfg.TILE_M)"})
    mod = load(src)
    assert vars(mod._FIXED) == {"TILE_M": 64, "num_ctas": 2}
    assert mod._hints(mod._CONFIGS[0]) == {"num_ctas": 1}


def test_render_checks_its_inputs():
    with pytest.raises(UsageError, match="must be in the generated search space"):
        render("occupancy", configs=[{"occupancy": 1}], fixed={"occupancy": 2}, **COMMON)
    with pytest.raises(UsageError, match="needs the in-place"):
        render("split_buffer", configs=[{"occupancy": 1}], fixed={"occupancy": 1}, **COMMON)
    with pytest.raises(UsageError, match="available: occupancy"):
        render("nope", configs=[Config(occupancy=1)], fixed=Config(occupancy=1), **COMMON)
