"""verify-triton: corpus kernels through the CPU interpreter (child processes), and the cases where it
cannot run, which must say so instead of passing."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from optional_deps import needs

from cutile_perf import cli
from cutile_perf.errors import UsageError
from cutile_perf.tileir import scan, verify

CORPUS = Path(__file__).resolve().parent / "triton_corpus"


def _case_args(name: str) -> list[str]:
    """The corpus file's VERIFY dict as verify-triton arguments (read with ast: nothing is imported)."""
    tree = ast.parse((CORPUS / f"{name}.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "VERIFY")
    v = ast.literal_eval(node.value)
    return ["--kernel", str(CORPUS / f"{name}.py"), "--reference", v["reference"], "--shapes", json.dumps(v["shapes"]),
            "--dtypes", json.dumps(v["dtypes"])]


def _verify(capsys, *args: str) -> tuple[int, dict]:
    code = cli.main(["verify-triton", "--json", "--device", "interpreter", *args])
    return code, json.loads(capsys.readouterr().out)


@needs("torch", "triton")
@pytest.mark.parametrize("name", ["vector_add", "softmax", "layernorm", "row_sum"])
def test_single_config_corpus_kernels_pass_in_the_interpreter(name, capsys):
    code, data = _verify(capsys, *_case_args(name))
    assert code == 0, data
    assert data["passed"] and data["mode"] == "interpreter"
    assert data["ptx"]["status"] == "passed" and data["ptx"]["target_backend"] == "interpreter"
    assert data["ptx"]["max_abs_diff"] is not None and data["ptx"]["max_abs_diff"] < 1e-3
    assert data["tileir"]["status"] == "not run" and "TileIR backend unavailable" in data["tileir"]["reason"]


@needs("torch", "triton")
def test_optimized_vector_add_still_passes_in_the_interpreter(tmp_path, capsys):
    out = tmp_path / "vector_add_tileir.py"
    assert cli.main(["classify-triton", "--file", str(CORPUS / "vector_add.py"), "--apply-optimizations",
                     "--output", str(out)]) == 0
    capsys.readouterr()
    args = _case_args("vector_add")
    args[1] = str(out)
    code, data = _verify(capsys, *args)
    assert code == 0 and data["passed"]


@needs("torch", "triton")
def test_a_wrong_reference_fails_with_the_difference(capsys):
    code, data = _verify(capsys, "--kernel", str(CORPUS / "vector_add.py"), "--reference", "x - y",
                         "--shapes", '{"x": [256], "y": [256]}')
    assert code == 1 and not data["passed"]
    case = data["ptx"]["cases"][0]
    assert case["passed"] is False and case["max_abs_diff"] > 0.1


def test_multi_config_autotune_is_not_run_on_cpu_and_says_why(capsys):
    code, data = _verify(capsys, *_case_args("splitk_matmul"))
    assert code == 3 and not data["ran"] and not data["passed"]
    assert data["ptx"]["status"] == "not run"
    assert "autotuned over 2 configs" in data["ptx"]["reason"]


@needs("torch", "triton")
def test_kernel_that_raises_is_an_error_not_a_pass(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x_ptr):\n    pass\n\n"
                   "def run(x):\n    k[(1,)](x)\n    raise ValueError('host bug')\n")
    code, data = _verify(capsys, "--kernel", str(bad), "--reference", "x", "--shapes", '{"x": [4]}')
    assert code == 1
    assert "ValueError: host bug" in data["ptx"]["cases"][0]["error"]


@needs("torch", "triton")
def test_module_that_fails_to_import_is_reported(tmp_path, capsys):
    bad = tmp_path / "bad_import.py"
    bad.write_text("import triton\nimport no_such_module_xyz\n@triton.jit\ndef k(x):\n    pass\n"
                   "def run(x):\n    k[(1,)](x)\n    return x\n")
    code, data = _verify(capsys, "--kernel", str(bad), "--reference", "x", "--shapes", '{"x": [4]}')
    assert code == 1 and data["ptx"]["status"] == "error"
    assert "no_such_module_xyz" in data["ptx"]["reason"]


def test_entry_defaults_to_first_public_launcher_and_rejects_the_kernel():
    module = scan.scan((CORPUS / "softmax.py").read_text())
    assert verify.find_entry(module, None) == "softmax"
    with pytest.raises(UsageError, match="kernel itself"):
        verify.find_entry(module, "softmax_kernel")
    with pytest.raises(UsageError, match="no top-level function"):
        verify.find_entry(module, "missing")


@pytest.mark.parametrize("shapes, dtypes, message", [
    ("not json", None, "not valid JSON"),
    ('{"x": "big"}', None, "list of non-negative integers"),
    ("[]", None, "non-empty"),
    ('{"x": [4]}', '{"x": "float8"}', "unknown dtype"),
])
def test_bad_shapes_and_dtypes_are_usage_errors(shapes, dtypes, message):
    with pytest.raises(UsageError, match=message):
        verify.parse_cases(shapes, dtypes, None, None)


def test_tolerance_follows_the_loosest_dtype_and_a_single_dtype_string_applies_to_all():
    (case,) = verify.parse_cases('{"a": [2], "b": [2]}', '"bfloat16"', None, None)
    assert case["dtypes"] == {"a": "bfloat16", "b": "bfloat16"}
    assert case["atol"] == verify.TOLERANCES["bfloat16"][0]
    (case,) = verify.parse_cases('{"a": [2]}', None, 0.5, None)
    assert case["atol"] == 0.5 and case["dtypes"] == {"a": "float32"}


def test_missing_kernel_file_is_exit_2(capsys):
    assert cli.main(["verify-triton", "--kernel", "/nonexistent.py", "--reference", "x", "--shapes", '{"x":[1]}']) == 2
