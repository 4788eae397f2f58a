"""Whether a candidate's results are the base kernel's, within the tolerance of their dtype.

Used by the reference child of checked timing (``checked``, ``checked_backward``): the base kernel's
results stay on its device and the candidate's captured ones are compared there, a chunk at a time;
a result too large to have been saved whole is compared by its summary (``tensor_summary``).
"""
from __future__ import annotations

from cutile_perf.child import tensor_summary

# Tolerances by dtype name (rtol, atol): TileGym's correctness defaults (tests/common.py,
# get_dtype_tolerances) widened where a kernel may legitimately reorder a reduction (fp32 by 100x:
# TF32 or another summation order); integers and booleans must match exactly.
TOLERANCES = {
    "float64": (1e-7, 1e-9), "float32": (1e-3, 1e-5), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2),
    "float8_e4m3fn": (1e-1, 1e-1), "float8_e5m2": (5e-1, 5e-1),
    "complex64": (1e-3, 1e-5), "complex128": (1e-7, 1e-9),
}
EXACT = (0.0, 0.0)


def tolerance(dtype) -> tuple[float, float]:
    return TOLERANCES.get(str(dtype).removeprefix("torch."), EXACT)


# Elements compared at once: the float64 copies of one chunk stay near 1 GB on the device, whatever
# the tensor's size (a TileGym rms_norm perf case returns 0.5 G elements).
COMPARE_CHUNK = 1 << 26


def compare(torch, expected: list, actual: list, chunk: int = COMPARE_CHUNK) -> str | None:
    """Why ``actual`` is not ``expected`` within the dtype's tolerance, or None when it is. Compared
    on ``expected``'s device (the reference child's GPU), ``chunk`` elements at a time."""
    if len(expected) != len(actual):
        return f"{len(actual)} result tensor(s) where the base kernel returns {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        shape, dtype = tensor_summary.shape_and_dtype(a)
        if tuple(e.shape) != shape or str(e.dtype) != dtype:
            return f"result {i}: {shape} {dtype} where the base kernel returns {tuple(e.shape)} {e.dtype}"
        if not tensor_summary.is_kept_whole(a):  # a large result, summarized by the capture
            why = compare_summary(torch, e, a)
            if why:
                return f"result {i}: {why}"
            continue
        rtol, atol = tolerance(e.dtype)
        flat_e, flat_a = e.reshape(-1), a.reshape(-1)
        count, worst = 0, 0.0
        for start in range(0, flat_e.numel(), chunk):
            ce, ca = flat_e[start:start + chunk], flat_a[start:start + chunk].to(e.device)
            n, w = _differ(torch, ce, ca, rtol, atol)
            count, worst = count + n, max(worst, w)
        if count:
            return (f"result {i}: {count} of {e.numel()} elements differ (rtol {rtol:g}, atol {atol:g}; "
                    f"largest difference {worst:.3g})")
    return None


def _differ(torch, e, a, rtol: float, atol: float) -> tuple[int, float]:
    """How many elements of ``a`` are not ``e`` within (rtol, atol), and the largest difference among them."""
    if (rtol, atol) == EXACT:
        bad = e != a
    else:
        wide = (lambda t: t) if e.is_complex() else (lambda t: t.to(torch.float64))
        bad = ~torch.isclose(wide(a), wide(e), rtol=rtol, atol=atol, equal_nan=True)
    count = int(bad.sum())
    if not count:
        return 0, 0.0
    diff = (a - e).abs() if a.is_complex() else (a.to(torch.float64) - e.to(torch.float64)).abs()
    return count, float(diff.nan_to_num(float("inf")).max())


def compare_summary(torch, expected, summary: dict) -> str | None:
    """Why the summarized result (``tensor_summary.keep_result``) does not fit ``expected`` (the
    base's, on its device), or None."""
    rtol, atol = tolerance(expected.dtype)
    positions = summary["positions"].to(expected.device)
    why = compare(torch, [expected.reshape(-1)[positions]], [summary["values"]])
    if why:
        return why.replace("result 0:", f"{len(positions)} sampled elements:", 1)
    rows, cols = tensor_summary.line_sums(torch, expected, absolute=False)
    if (rtol, atol) == EXACT:
        row_bound = col_bound = None
    else:
        abs_rows, abs_cols = tensor_summary.line_sums(torch, expected, absolute=True)
        last = expected.shape[-1] if expected.dim() else 1
        # + 1e-9 of the magnitudes: float64 rounding of sums of up to 2**24 terms, on either side
        row_bound = atol * last + (rtol + 1e-9) * abs_rows
        col_bound = atol * (expected.numel() // max(last, 1)) + (rtol + 1e-9) * abs_cols
    for name, base, got, bound in (("row", rows, summary["rows"], row_bound),
                                   ("column", cols, summary["cols"], col_bound)):
        bad = _sums_differ(torch, base, got.to(base.device), bound)
        if bad:
            return (f"{bad} of {base.numel()} {name} sums differ beyond what the elements' tolerance allows "
                    f"(rtol {rtol:g}, atol {atol:g}; the tensor was summarized, "
                    f"{tensor_summary.nbytes(expected) >> 20} MB)")
    return None


def _sums_differ(torch, base, got, bound) -> int:
    """How many of ``got`` differ from ``base`` beyond ``bound`` (exactly, where ``bound`` is None);
    non-finite sums must be non-finite alike."""
    if bound is None:
        return int((base != got).sum())
    finite = torch.isfinite(base) & torch.isfinite(got)
    over = finite & ((got - base).abs() > bound)
    odd = ~finite & ~((torch.isnan(base) & torch.isnan(got)) | (base == got))
    return int(over.sum()) + int(odd.sum())
