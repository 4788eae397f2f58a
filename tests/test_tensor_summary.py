"""What a capture keeps of a large tensor (``child.tensor_summary``): fingerprints for inputs, summaries
for results, compared so that matching results always pass and skipped work does not."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutile_perf.child import tensor_summary  # noqa: E402
from cutile_perf.child.compare_results import TOLERANCES, compare  # noqa: E402


@pytest.fixture(autouse=True)
def small_limits(monkeypatch):
    # Small tensors exercise the large-tensor path; chunks smaller than a row exercise the parts.
    monkeypatch.setattr(tensor_summary, "INLINE_BYTES", 1024)
    monkeypatch.setattr(tensor_summary, "CHUNK", 100)
    monkeypatch.setattr(tensor_summary, "SAMPLE", 64)


def result(dtype=torch.float32, shape=(40, 300)):
    torch.manual_seed(1)
    return torch.randn(*shape).to(dtype)


def test_small_tensors_are_kept_whole_and_large_ones_summarized():
    small, large = torch.ones(4), result()
    assert torch.equal(tensor_summary.keep_result(torch, small), small)
    kept = tensor_summary.keep_result(torch, large)
    assert kept["summary"] and kept["rows"].shape == (40,) and kept["cols"].shape == (300,)
    assert kept["values"].numel() == 64 and tensor_summary.shape_and_dtype(kept) == ((40, 300), "torch.float32")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_results_within_the_elementwise_tolerance_always_pass(dtype):
    base = result(dtype)
    rtol, atol = TOLERANCES[str(dtype).removeprefix("torch.")]
    # every element moved by most of its tolerance (bfloat16 rounding takes the rest), all in one
    # direction: the worst case for the sums
    near = (base.to(torch.float64) + 0.7 * (atol + rtol * base.to(torch.float64).abs())).to(dtype)
    assert compare(torch, [base], [near]) is None  # whole: within tolerance
    assert compare(torch, [base], [tensor_summary.keep_result(torch, near)]) is None


@pytest.mark.parametrize("damage", ["row", "column", "nan", "stale"])
def test_skipped_or_wrong_work_is_found_in_a_summary(damage):
    base = result()
    bad = base.clone()
    if damage == "row":
        bad[17] = 0.0  # one row never written
    elif damage == "column":
        bad[:, 299] += 0.5  # the last tile of every row wrong
    elif damage == "nan":
        bad[3, 5] = float("nan")
    else:
        bad[20:] = base[:20]  # the second half holds what the first half computed
    summary = tensor_summary.keep_result(torch, bad)
    why = compare(torch, [base], [summary])
    assert why is not None and why.startswith("result 0:"), why


def test_integer_results_compare_exactly():
    base = torch.arange(4000, dtype=torch.int64).reshape(40, 100)
    bad = base.clone()
    bad[7, 7] += 1
    assert compare(torch, [base], [tensor_summary.keep_result(torch, base.clone())]) is None
    # One comparison, read once: the summary samples elements at random, so the sample may find the
    # changed element before the row sums do (two calls could each say a different one).
    why = compare(torch, [base], [tensor_summary.keep_result(torch, bad)])
    assert why is not None and ("row sums differ" in why or "sampled elements" in why), why


def test_a_summary_of_another_shape_or_dtype_says_so():
    summary = tensor_summary.keep_result(torch, result())
    assert "(40, 300)" in compare(torch, [result(shape=(300, 40))], [summary])


def test_fingerprints_tell_equal_inputs_from_changed_ones():
    x = result()
    same = tensor_summary.fingerprint(torch, x.clone())
    assert tensor_summary.fingerprint(torch, x) == same
    nudged = x.clone()
    nudged.view(-1)[12345 % x.numel()] = torch.nextafter(nudged.view(-1)[12345 % x.numel()], torch.tensor(9.0))
    assert tensor_summary.fingerprint(torch, nudged) != same
    assert tensor_summary.fingerprint(torch, x.flip(0)) != same  # the same values elsewhere
    odd = torch.arange(7, dtype=torch.uint8)  # bytes that do not make whole int32 words
    assert tensor_summary.fingerprint(torch, odd) == tensor_summary.fingerprint(torch, odd.clone())


def test_a_large_input_is_kept_as_its_fingerprint():
    x = result()
    kept = tensor_summary.keep_input(torch, x)
    assert kept == {"fingerprint": tensor_summary.fingerprint(torch, x), "shape": [40, 300], "dtype": "torch.float32"}
