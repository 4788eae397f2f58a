"""stats.py: pure statistics over plain lists, checked against hand-computed values."""
from __future__ import annotations

import math
import statistics

import pytest

from cutile_perf.judge import stats

SAMPLES = [0.2799, 0.2759, 0.2852, 0.2801, 0.2795, 0.2810, 0.2788]


def test_central_values_match_the_standard_library():
    assert stats.mean(SAMPLES) == pytest.approx(statistics.fmean(SAMPLES))
    assert stats.median(SAMPLES) == statistics.median(SAMPLES)
    assert stats.median([1, 3, 2, 4]) == 2.5
    assert stats.std(SAMPLES) == pytest.approx(statistics.stdev(SAMPLES))
    assert stats.std([5.0]) == 0.0


@pytest.mark.parametrize("fn", [stats.mean, stats.median, stats.std, stats.geomean,
                                stats.relative_spread])
def test_empty_input_is_an_error_not_a_nan(fn):
    with pytest.raises(ValueError, match="at least one value"):
        fn([])


def test_quantile_is_linear_interpolation():
    assert stats.quantile([1, 2, 3, 4], 0.5) == 2.5
    assert stats.quantile([1, 2, 3, 4], 0.25) == 1.75  # numpy's default method gives 1.75
    assert stats.quantile([7], 0.9) == 7
    with pytest.raises(ValueError):
        stats.quantile([1, 2], 1.5)


def test_rel_std_is_a_percentage_like_tilegym():
    assert stats.rel_std_percent([1.0, 1.0]) == 0.0
    assert stats.rel_std_percent(SAMPLES) == pytest.approx(100 * statistics.stdev(SAMPLES) / statistics.fmean(SAMPLES))


def test_geomean():
    assert stats.geomean([1, 4, 16]) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="positive"):
        stats.geomean([1.0, 0.0])


def test_summarize_has_the_tilegym_record_fields():
    record = stats.summarize(SAMPLES, peak_mem_mb=1268)
    assert set(record) == {"mean", "std", "rel_std", "median", "min", "max", "nrep", "peak_mem_mb"}
    assert record["nrep"] == 7 and record["min"] == 0.2759 and record["max"] == 0.2852
    assert "peak_mem_mb" not in stats.summarize([1.0])


def test_relative_change_and_spread():
    assert stats.relative_change(2.0, 1.8) == pytest.approx(-0.1)  # 10 % lower = faster
    with pytest.raises(ValueError):
        stats.relative_change(0.0, 1.0)
    assert stats.relative_spread([0.99, 1.0, 1.01]) == pytest.approx(0.02)


def test_ratio_ci_is_deterministic_and_centered():
    ref = [1.0, 1.01, 0.99, 1.0, 1.02]
    cand = [0.9, 0.91, 0.89, 0.9, 0.92]
    ratio, lo, hi = stats.ratio_ci(ref, cand)
    assert ratio == pytest.approx(0.9)
    assert lo <= ratio <= hi < 1.0
    assert stats.ratio_ci(ref, cand) == (ratio, lo, hi)  # fixed seed: same samples, same verdict
    same = stats.ratio_ci(ref, ref)
    assert same[1] <= 1.0 <= same[2]


def test_ratio_ci_rejects_empty_sides():
    with pytest.raises(ValueError):
        stats.ratio_ci([], [1.0])
    assert math.isfinite(stats.ratio_ci([1.0], [2.0])[0])
