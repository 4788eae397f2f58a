"""benchmarks/harness_overhead.py's TileGym breakdown, on hand-made log rows (the GPU run is the real path)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "harness_overhead.py"
_spec = importlib.util.spec_from_file_location("harness_overhead", _PATH)
overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead)


def test_stage_names_group_into_kinds():
    assert overhead.stage_kind("3-correctness") == "correctness"
    assert overhead.stage_kind("3-perf") == "perf"
    assert overhead.stage_kind("12-confirm2-base-perf") == "re-check perf (interleaved)"


def test_breakdown_sums_stages_per_try_and_counts_missing_kinds_as_zero():
    rows = [
        {"timings": {"stages": [["1-correctness", 10.0], ["1-perf", 5.0]], "harness_s": 0.2, "total_s": 15.2}},
        {"timings": {"stages": [["2-correctness", 12.0], ["2-perf", 6.0], ["2-confirm1-base-perf", 5.0],
                                ["2-confirm1-cand-perf", 5.0]], "harness_s": 0.4, "total_s": 28.4}},
        {"timings": {"stages": [["3-correctness", 11.0], ["3-perf", 7.0]], "harness_s": 0.3, "total_s": 18.3}},
    ]
    table = {name: (seconds, note) for name, seconds, note in overhead.try_breakdown(rows)}
    assert table["stage: correctness"][0] == pytest.approx(11.0)
    assert table["stage: perf"][0] == pytest.approx(6.0)
    # Only one try of three re-checked (two runs, 10 s): a third of that per try.
    assert table["stage: re-check perf (interleaved)"][0] == pytest.approx(10 / 3)
    assert table["stage: re-check perf (interleaved)"][1] == "0.7 run(s) per try"
    assert table["harness's own share (logged harness_s)"][0] == pytest.approx(0.3)
    assert table["whole try (logged total_s)"][1] == f"{3600 / ((15.2 + 28.4 + 18.3) / 3):.0f} iterations per hour"
