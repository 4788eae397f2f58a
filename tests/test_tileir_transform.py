"""--apply-optimizations: TileIR configs are added beside the originals, only when the TileIR backend
is active; under standard triton the optimized module's config lists are exactly the original ones."""
from __future__ import annotations

import ast
import importlib.util
import json
import uuid
from pathlib import Path

import pytest
from optional_deps import needs

from cutile_perf import cli
from cutile_perf.tileir import transform
from cutile_perf.tileir.classify import classify_source

CORPUS = Path(__file__).resolve().parent / "triton_corpus"
AUTOTUNED = {"vector_add": "add_kernel", "softmax": "softmax_kernel", "row_sum": "row_sum_kernel",
             "matmul": "matmul_kernel", "splitk_matmul": "splitk_kernel"}


def _optimize(name: str) -> dict:
    src = (CORPUS / f"{name}.py").read_text()
    return transform.apply_optimizations(src, classify_source(src))


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(f"corpus_{path.stem}_{uuid.uuid4().hex}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config_tuples(configs):
    return [(c.kwargs, c.num_warps, c.num_stages, c.num_ctas) for c in configs]


class _FakeTarget:
    backend, arch = "tileir", 100


class _FakeTileIRDriver:
    def get_current_target(self):
        return _FakeTarget()


@pytest.mark.parametrize("name", sorted(AUTOTUNED))
def test_optimized_code_keeps_the_original_configs_text_and_parses(name):
    result = _optimize(name)
    code = result["optimized_code"]
    ast.parse(code)
    assert transform.MARKER in code
    assert any(AUTOTUNED[name] in change for change in result["changes_applied"])
    original = (CORPUS / f"{name}.py").read_text()
    # Every line of the original is still there, in order: only additions and the configs wrapper.
    kernel_body = original[original.index("@triton.jit"):]
    assert kernel_body in code


@needs("triton")
@pytest.mark.parametrize("name", sorted(AUTOTUNED))
def test_standard_triton_sees_exactly_the_original_configs(name, tmp_path):
    """No active driver here (CPU), as on a GPU with stock triton: the gate is false."""
    out = tmp_path / f"{name}_tileir.py"
    out.write_text(_optimize(name)["optimized_code"])
    original = _import(CORPUS / f"{name}.py")
    optimized = _import(out)
    kernel = AUTOTUNED[name]
    assert _config_tuples(getattr(optimized, kernel).configs) == _config_tuples(getattr(original, kernel).configs)
    assert not any("occupancy" in c.kwargs for c in getattr(optimized, kernel).configs)


@needs("triton")
@pytest.mark.parametrize("name", sorted(AUTOTUNED))
def test_tileir_backend_active_appends_variants_after_the_originals(name, tmp_path, monkeypatch):
    from triton.runtime import driver

    out = tmp_path / f"{name}_tileir.py"
    out.write_text(_optimize(name)["optimized_code"])
    original = getattr(_import(CORPUS / f"{name}.py"), AUTOTUNED[name]).configs
    monkeypatch.setattr(driver, "_active", _FakeTileIRDriver())
    configs = getattr(_import(out), AUTOTUNED[name]).configs
    n = len(original)
    assert _config_tuples(configs[:n]) == _config_tuples(original)
    added = configs[n:]
    assert 0 < len(added) <= 24
    assert all("occupancy" in c.kwargs for c in added)
    assert len({json.dumps(t, sort_keys=True, default=str) for t in _config_tuples(added)}) == len(added)
    # The kernel's own meta-parameter names are kept (BLOCK_SIZE_M stays BLOCK_SIZE_M).
    assert all(set(c.kwargs) - {"occupancy"} == set(original[0].kwargs) for c in added)


@needs("triton")
def test_dot_kernel_variants_use_two_ctas_and_larger_tiles(tmp_path, monkeypatch):
    from triton.runtime import driver

    out = tmp_path / "matmul_tileir.py"
    out.write_text(_optimize("matmul")["optimized_code"])
    monkeypatch.setattr(driver, "_active", _FakeTileIRDriver())
    added = [c for c in _import(out).matmul_kernel.configs if "occupancy" in c.kwargs]
    assert {c.num_ctas for c in added} == {1, 2}
    tiles = {(c.kwargs["BLOCK_SIZE_M"], c.kwargs["BLOCK_SIZE_N"]) for c in added}
    assert {(256, 128), (128, 256), (256, 256)} <= tiles


def test_plain_jit_kernel_is_left_alone_with_a_reason():
    result = _optimize("layernorm")
    assert result["changes_applied"] == []
    assert result["optimized_code"] == (CORPUS / "layernorm.py").read_text()
    assert "_layer_norm_fwd" in result["skipped"][0]


def test_applying_twice_changes_nothing_the_second_time():
    once = _optimize("vector_add")["optimized_code"]
    twice = transform.apply_optimizations(once, classify_source(once))
    assert twice["optimized_code"] == once and twice["changes_applied"] == []


def test_multiline_configs_and_comments_survive():
    code = _optimize("splitk_matmul")["optimized_code"]
    assert "reset_to_zero=[\"c_ptr\"],  # partial sums accumulate into c" in code


def test_cli_writes_output_and_refuses_to_overwrite_the_input(tmp_path, capsys):
    src = tmp_path / "k.py"
    src.write_text((CORPUS / "vector_add.py").read_text())
    out = tmp_path / "k_tileir.py"
    assert cli.main(["classify-triton", "--file", str(src), "--apply-optimizations", "--output", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert out.read_text() == data["optimized_code"] and data["changes_applied"]
    before = src.read_text()
    code = cli.main(["classify-triton", "--file", str(src), "--apply-optimizations", "--output", str(src)])
    assert code == 2 and src.read_text() == before
    assert cli.main(["classify-triton", "--file", str(src), "--output", str(out)]) == 2


def _autotune_keywords(source: str) -> dict[str, str]:
    """Every @triton.autotune keyword but configs, as source text, per kernel."""
    found = {}
    for fn in ast.parse(source).body:
        for dec in getattr(fn, "decorator_list", []):
            if isinstance(dec, ast.Call) and ast.unparse(dec.func) == "triton.autotune":
                found[fn.name] = {kw.arg: ast.unparse(kw.value) for kw in dec.keywords if kw.arg != "configs"}
    return found


@pytest.mark.parametrize("name", sorted(AUTOTUNED))
def test_autotune_keywords_other_than_configs_are_kept_verbatim(name):
    original = (CORPUS / f"{name}.py").read_text()
    assert _autotune_keywords(_optimize(name)["optimized_code"]) == _autotune_keywords(original)


@needs("triton")
def test_reset_to_zero_and_restore_value_also_cover_the_gated_tileir_configs(tmp_path, monkeypatch):
    """They are autotuner-wide hooks, not per-config: kept in the decorator, they apply to every
    added config too, so timing the TileIR variants cannot accumulate into the split-K output."""
    from triton.runtime import driver

    src = (CORPUS / "splitk_matmul.py").read_text().replace(
        'reset_to_zero=["c_ptr"],', 'reset_to_zero=["c_ptr"], restore_value=["a_ptr"],')
    out = tmp_path / "splitk_tileir.py"
    out.write_text(transform.apply_optimizations(src, classify_source(src))["optimized_code"])
    plain = _import(out).splitk_kernel
    assert (plain.reset_to_zero, plain.restore_value, len(plain.configs)) == (["c_ptr"], ["a_ptr"], 2)
    monkeypatch.setattr(driver, "_active", _FakeTileIRDriver())
    gated = _import(out).splitk_kernel
    assert len(gated.configs) > 2 and (gated.reset_to_zero, gated.restore_value) == (["c_ptr"], ["a_ptr"])
