"""The TileIR report marks every section that was not run instead of inventing it."""
from __future__ import annotations

import json
from pathlib import Path

from cutile_perf import cli
from cutile_perf.tileir import check, classify, report, transform

CORPUS = Path(__file__).resolve().parent / "triton_corpus"


def _render(verification=None, tileir=None, apply=True):
    src = (CORPUS / "softmax.py").read_text()
    result = classify.classify_source(src)
    transformation = transform.apply_optimizations(src, result) if apply else None
    return report.render(kernel_file="softmax.py", classification=result, transformation=transformation,
                         verification=verification, tileir=tileir or check.check(), output_file=None)


def test_without_verification_or_tileir_everything_unrun_says_so():
    text = _render()
    assert "## TileIR Optimization: softmax_kernel" in text
    assert "- Kernel type: norm-like" in text
    assert "### Compatibility Check (ENABLE_TILE=0)\nnot run: no verify-triton result was given" in text
    assert "### TileIR Validation (ENABLE_TILE=1)\nnot run: TileIR backend unavailable" in text
    assert "not run: TileIR backend unavailable — no PTX vs TileIR timing" in text
    assert "| PTX (ENABLE_TILE=0) | not run | n/a |" in text
    assert "PASSED" not in text and "ms" not in text.split("### Benchmark")[1].split("|")[0]


def test_verification_numbers_come_from_the_given_result():
    verification = {"ptx": {"status": "passed", "max_abs_diff": 1.5e-8, "max_rel_diff": 2e-7, "cases": [{}, {}],
                            "target_backend": "cuda", "reason": None},
                     "tileir": {"status": "not run", "reason": "TileIR backend unavailable: no module", "cases": []}}
    text = _render(verification=verification)
    assert "PASSED — Max difference: 1.5e-08 (max relative 2.0e-07; 2 shape(s); target cuda)" in text
    assert "not run: TileIR backend unavailable" in text


def test_failed_pass_and_no_transformation():
    verification = {"ptx": {"status": "failed", "max_abs_diff": 0.5, "max_rel_diff": 1.0, "cases": [{}],
                            "target_backend": "interpreter", "reason": None},
                    "tileir": {"status": "not run", "reason": "x", "cases": []}}
    text = _render(verification=verification, apply=False)
    assert "FAILED — Max difference: 5.0e-01" in text
    assert "- not run: --apply-optimizations was not given" in text


def test_cli_report_with_verification_file(tmp_path, capsys):
    verification = tmp_path / "verify.json"
    verification.write_text(json.dumps({"ptx": {"status": "not run", "reason": "no CUDA GPU", "cases": []},
                                        "tileir": {"status": "not run", "reason": "no GPU", "cases": []}}))
    out = tmp_path / "report.md"
    code = cli.main(["classify-triton", "--file", str(CORPUS / "matmul.py"), "--apply-optimizations",
                     "--report", str(out), "--verification", str(verification)])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["report_file"] == str(out)
    text = out.read_text()
    assert "- Kernel type: dot-related" in text and "not run: no CUDA GPU" in text
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert cli.main(["classify-triton", "--file", str(CORPUS / "matmul.py"), "--report", str(out),
                     "--verification", str(bad)]) == 2
