"""The reference child's comparison of results (``child.compare_results``): by dtype tolerance, a chunk
at a time, with the same verdict whatever the chunk size."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutile_perf.child.compare_results import TOLERANCES, compare  # noqa: E402


def test_results_within_the_dtype_tolerance_match():
    e = torch.linspace(-4, 4, 1000, dtype=torch.float16)
    rtol, _atol = TOLERANCES["float16"]
    assert compare(torch, [e], [e * (1 + rtol / 4)]) is None


@pytest.mark.parametrize("chunk", [7, 64, 1 << 26])
def test_a_wrong_element_is_found_and_counted_whatever_the_chunk(chunk):
    e = torch.ones(4, 50, dtype=torch.bfloat16)
    a = e.clone()
    a[3, 49] = 3.0  # the very last element: the last, partial chunk
    a[0, 0] = float("nan")
    why = compare(torch, [e], [a], chunk=chunk)
    assert why is not None and "2 of 200 elements differ" in why and "largest difference inf" in why


def test_nan_where_the_base_gives_nan_matches():
    e = torch.tensor([1.0, float("nan")])
    assert compare(torch, [e], [e.clone()], chunk=1) is None


def test_integers_must_match_exactly():
    e = torch.arange(10, dtype=torch.int32)
    a = e.clone()
    a[5] += 1
    assert "1 of 10 elements differ" in compare(torch, [e], [a], chunk=3)


def test_shape_dtype_and_count_mismatches_say_what_differs():
    e = torch.zeros(2, 3)
    assert "(3, 2)" in compare(torch, [e], [torch.zeros(3, 2)])
    assert "torch.float16" in compare(torch, [e], [torch.zeros(2, 3, dtype=torch.float16)])
    assert "2 result tensor(s)" in compare(torch, [e], [e, e])
