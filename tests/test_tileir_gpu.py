"""GPU: the optimized corpus autotunes and matches torch on standard triton (the gate stays false)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tileir_corpus.py"


@pytest.mark.gpu
def test_optimized_corpus_runs_unchanged_on_standard_triton(capsys):
    spec = importlib.util.spec_from_file_location("tileir_corpus_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code = module.main([])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "active target cuda" in out
