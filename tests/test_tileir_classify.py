"""classify-triton: AST classification of the Triton corpus, name resolution, risk flags, JSON shape."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cutile_perf import cli
from cutile_perf.errors import UsageError
from cutile_perf.tileir.classify import classify_source

CORPUS = Path(__file__).resolve().parent / "triton_corpus"


@pytest.mark.parametrize("name, kind", [
    ("vector_add", "element-wise"),
    ("softmax", "norm-like"),
    ("layernorm", "norm-like"),
    ("row_sum", "reduction"),
    ("matmul", "dot-related"),
    ("splitk_matmul", "dot-related"),
])
def test_corpus_classification(name, kind):
    result = classify_source((CORPUS / f"{name}.py").read_text())
    assert result["classification"] == kind
    assert 0.5 <= result["confidence"] <= 1.0
    assert result["indicators"] and result["recommendations"]


def test_split_k_with_atomics_is_flagged_risky():
    result = classify_source((CORPUS / "splitk_matmul.py").read_text())
    patterns = {r["pattern"] for r in result["risks"]}
    assert {"atomics", "split-K cross-block reduction"} <= patterns
    assert all(r["kernel"] == "splitk_kernel" for r in result["risks"])


def test_safe_corpus_kernels_have_no_risks():
    for name in ("vector_add", "softmax", "layernorm", "row_sum", "matmul"):
        assert classify_source((CORPUS / f"{name}.py").read_text())["risks"] == [], name


KERNEL_HEAD = "import triton\n"


def _one(src: str) -> dict:
    result = classify_source(src)
    assert len(result["kernels"]) == 1
    return result["kernels"][0]


def test_aliases_through_from_imports_resolve():
    src = (
        "from triton import jit\nfrom triton import language as lang\nfrom triton.language import dot as mma\n"
        "@jit\ndef k(a, b, c, BLOCK: lang.constexpr):\n"
        "    x = lang.load(a)\n    y = lang.load(b)\n    lang.store(c, mma(x, y))\n"
    )
    kernel = _one(src)
    assert kernel["classification"] == "dot-related"
    assert kernel["ops"]["dot"] == 1 and kernel["ops"]["load"] == 2


def test_tensor_method_reduction_counts_as_reduction():
    src = KERNEL_HEAD + "import triton.language as tl\n@triton.jit\ndef k(x_ptr, o_ptr):\n" \
                        "    x = tl.load(x_ptr + tl.arange(0, 16))\n    tl.store(o_ptr, x.sum(axis=0))\n"
    assert _one(src)["classification"] == "reduction"


def test_regex_traps_do_not_fool_the_ast():
    """`tl.dot(` inside a string or comment, and a host function calling torch.matmul, are not kernels' dots."""
    src = (
        "import torch\nimport triton\nimport triton.language as tl\n"
        "# this kernel is not tl.dot( based\n"
        "@triton.jit\ndef k(x_ptr, o_ptr):\n    msg = 'tl.dot(a, b)'\n"
        "    offs = tl.arange(0, 16)\n    tl.store(o_ptr + offs, tl.load(x_ptr + offs) * 2)\n"
        "def host(a, b):\n    return torch.matmul(a, b)\n"
    )
    assert classify_source(src)["classification"] == "element-wise"


def test_kernels_under_autotune_and_heuristics_are_found_and_the_main_one_is_the_dot():
    src = (
        "import triton\nimport triton.language as tl\n"
        "@triton.heuristics(values={'EVEN': lambda args: args['n'] % 16 == 0})\n@triton.jit\n"
        "def scale(x_ptr, n, EVEN: tl.constexpr):\n    tl.store(x_ptr, tl.load(x_ptr) * 2)\n"
        "@triton.autotune(configs=[triton.Config({'B': 16})], key=['n'])\n@triton.jit\n"
        "def mm(a_ptr, n, B: tl.constexpr):\n    tl.store(a_ptr, tl.dot(tl.load(a_ptr), tl.load(a_ptr)))\n"
    )
    result = classify_source(src)
    assert [k["name"] for k in result["kernels"]] == ["scale", "mm"]
    assert result["kernel"] == "mm" and result["classification"] == "dot-related"
    assert result["kernels"][1]["autotune"] == {"config_count": 1, "key": ["n"], "reset_to_zero": [],
                                                "restore_value": []}


@pytest.mark.parametrize("body, pattern", [
    ("    tl.store(x_ptr, tl.load(x_ptr) + 1)\n", "aliasing"),
    ("    y = tl.inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', [tl.load(x_ptr)], dtype=tl.int32, "
     "is_pure=True, pack=1)\n    tl.store(o_ptr, y)\n", "inline asm"),
    ("    p = tl.make_block_ptr(x_ptr, (16,), (1,), (0,), (16,), (0,))\n    tl.store(o_ptr, tl.load(p))\n",
     "make_block_ptr"),
    ("    while tl.atomic_cas(o_ptr, 0, 1) == 1:\n        pass\n", "lock or spin-wait"),
])
def test_risky_patterns_are_flagged(body, pattern):
    src = "import triton\nimport triton.language as tl\n@triton.jit\ndef k(x_ptr, o_ptr):\n" + body
    assert pattern in {r["pattern"] for r in _one(src)["risks"]}


def test_ungated_occupancy_in_configs_is_flagged():
    src = ("import triton\nimport triton.language as tl\n"
           "@triton.autotune(configs=[triton.Config({'B': 16, 'occupancy': 2})], key=[])\n@triton.jit\n"
           "def k(x_ptr, B: tl.constexpr):\n    tl.store(x_ptr, tl.load(x_ptr) * 2)\n")
    assert "occupancy in configs" in {r["pattern"] for r in _one(src)["risks"]}


def test_source_without_kernels():
    result = classify_source("import torch\n\ndef f(x):\n    return x + 1\n")
    assert result["classification"] is None and result["kernels"] == []


def test_syntax_error_is_a_usage_error_with_the_line():
    with pytest.raises(UsageError, match="line 2"):
        classify_source("import triton\ndef broken(:\n")


def test_cli_json_schema(capsys):
    code = cli.main(["classify-triton", "--file", str(CORPUS / "softmax.py")])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {"kernel", "classification", "confidence", "strategy", "indicators", "recommendations", "risks",
            "kernels"} <= set(data)
    assert "optimized_code" not in data
    kernel = data["kernels"][0]
    assert {"name", "line", "classification", "confidence", "indicators", "recommendations", "risks", "autotune",
            "ops"} <= set(kernel)
    assert isinstance(data["confidence"], float)


def test_cli_code_option_and_missing_file(capsys):
    src = (CORPUS / "vector_add.py").read_text()
    assert cli.main(["classify-triton", "--code", src]) == 0
    assert json.loads(capsys.readouterr().out)["classification"] == "element-wise"
    assert cli.main(["classify-triton", "--file", "/nonexistent/kernel.py"]) == 2


ATOMIC_KERNEL = ("import triton\nimport triton.language as tl\n"
                 "@triton.autotune(configs=[triton.Config({'B': 16}), triton.Config({'B': 32})], key=['n']EXTRA)\n"
                 "@triton.jit\ndef k(x_ptr, out_ptr, n, B: tl.constexpr):\n"
                 "    offs = tl.program_id(0) * B + tl.arange(0, B)\n"
                 "    out_ptrs = out_ptr + offs * 0\n"
                 "    tl.atomic_add(out_ptrs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)\n")
RESET_RISK = "atomic output not reset by autotune"


def test_autotuned_atomic_output_must_be_reset_between_timed_runs():
    """The pointer is found through the local ``out_ptrs``; a missing reset_to_zero is a risk."""
    risks = _one(ATOMIC_KERNEL.replace("EXTRA", ""))["risks"]
    (risk,) = [r for r in risks if r["pattern"] == RESET_RISK]
    assert "out_ptr" in risk["detail"] and "reset_to_zero=['out_ptr']" in risk["why"]
    for extra in (", reset_to_zero=['out_ptr']", ", restore_value=('out_ptr',)", ", reset_to_zero='out_ptr'"):
        kernel = _one(ATOMIC_KERNEL.replace("EXTRA", extra))
        assert RESET_RISK not in {r["pattern"] for r in kernel["risks"]}, extra
    assert _one(ATOMIC_KERNEL.replace("EXTRA", ", reset_to_zero=['x_ptr']"))["autotune"]["reset_to_zero"] == ["x_ptr"]


def test_corpus_split_k_declares_its_atomic_output_in_reset_to_zero():
    (kernel,) = classify_source((CORPUS / "splitk_matmul.py").read_text())["kernels"]
    assert kernel["autotune"]["reset_to_zero"] == ["c_ptr"]
    assert RESET_RISK not in {r["pattern"] for r in kernel["risks"]}
