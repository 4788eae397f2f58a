"""Helpers shared by the op tests: tolerances, input generation, GPU skip, benchmark records.

A new op test imports this module (``from tests import common``) and follows test_rms_norm.py:
``test_op`` parametrized over ``backend`` (id ``cutile``) for correctness, ``test_perf`` over
``framework`` (``cutile``, ``pytorch``) that checks correctness first, then calls
``record_benchmark``.
"""
from __future__ import annotations

import secrets

import pytest

torch = pytest.importorskip("torch")

BACKENDS = ["cutile"]  # correctness tests; the id is what TileGym's `-k "... cutile ..."` selects
PERF_FRAMEWORKS = ["cutile", "pytorch"]  # pytorch gives a reference timing in the same run

# (atol, rtol) per dtype: fp32 results are compared tightly; half types allow a few ulps of the
# output format on values of magnitude ~1-4 (fp16 ulp at 2 is 2e-3, bf16 ulp at 2 is 1.6e-2).
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 2e-2),
}

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def dtype_id(dtype) -> str:
    return str(dtype).replace("torch.", "")


def shape_id(shape) -> str:
    return "x".join(str(d) for d in shape)


def shape_dtype_params(cases):
    """``pytest.param(shape, dtype, id="64x1000-float16")`` for each (shape, dtype) case."""
    return [pytest.param(shape, dtype, id=f"{shape_id(shape)}-{dtype_id(dtype)}") for shape, dtype in cases]


def assert_close(actual, expected, dtype=None, *, scale: float = 1.0) -> None:
    """Compare with the dtype's tolerance (``scale`` widens it for ops with longer reductions)."""
    atol, rtol = TOLERANCES[dtype or expected.dtype]
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=atol * scale, rtol=rtol * scale)


def randn(shape, dtype, *, seed: int = 0, scale: float = 1.0, shift: float = 0.0):
    """Reproducible normal input on the GPU (generated in fp32 so every dtype sees the same values)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32) * scale + shift).to(dtype)


def record_benchmark(record_property, framework: str, fn, *, inputs=None, reference=None, dtype=None,
                     **bench_kwargs) -> dict:
    """Time ``fn`` with cutile-perf's one timing method and record TileGym's benchmark dict.

    The record ``{framework: {"forward": {mean, std, rel_std, median, min, max, nrep, peak_mem_mb}}}``
    is stored with ``record_property("benchmark", ...)``, exactly where TileGym puts it, so the
    harness reads these tests like TileGym's. Times are milliseconds; rel_std is in percent. The
    record also carries ``device_ms`` (bench's device-time witness, which the harness cross-checks).

    With ``inputs`` (the tensors ``fn`` reads) and ``reference`` (computes the expected result from
    their current values), the first and last timed calls run on fresh input values and are compared
    with ``assert_close`` at ``dtype``'s tolerance: a kernel that does less work only when it is
    timed fails here instead of looking faster (``checked_calls`` in the record).
    """
    try:
        from cutile_perf.bench import OutputCheck, bench_record
    except ImportError as exc:  # the perf tests are meaningless without the shared timing method
        raise ImportError("perf tests need cutile_perf importable (pip install -e <cutile-perf checkout>)") from exc
    if reference is not None:
        bench_kwargs["check"] = OutputCheck(tuple(inputs), reference, lambda actual, expected: assert_close(
            actual, expected, dtype))
    record = {framework: {"forward": bench_record(fn, **bench_kwargs)}}
    record_property("benchmark", record)
    return record


# --- the defence run (CUTILE_PERF_DEFENCE=1 or --defence; tests marked `defence`) ------------------
#
# Checks that a kernel cannot pass by gaming the ordinary tests (references/harness.md, "Attacks and
# outcomes" in the cutile-perf checkout): fresh random inputs on every call, so an output cached by
# input pointer or fingerprint is stale; outputs allocated from NaN-poisoned memory, so a result left
# partly unwritten shows; results that must not alias an earlier result; the perf tests' own shapes,
# so a kernel that does less work only there is caught; and a float64 reference compared ulp by ulp,
# which a kernel that computes in fp16/bf16 instead of fp32 fails.

# Half outputs: the result must be the correctly rounded float64 value, give or take one rounding of
# fp32 math. A kernel with fp32 accumulation is off by 1 ulp on ~0.01 % of elements; the same kernel
# computing in fp16/bf16 on 20-80 % (CPU emulation of the softmax kernel, 5 shapes; the attack in
# benchmarks/redteam/attacks/ is that kernel). Differences below ABS_FLOOR x the output's RMS are not
# counted: fp32 math that cancels (layer_norm's x - mean) leaves ~1e-6 absolute error, many ulps of
# an output that happens to be near zero.
MAX_OFF_BY_ONE_FRACTION = 0.02
MAX_ULPS = 4
ABS_FLOOR = 2.0**-16
FP32_MAX_REL_ERROR = 1e-5  # relative Frobenius error of an fp32 result against float64


def fresh_seed() -> int:
    """A new seed for every call (never reproducible by a cache); failures print it."""
    return secrets.randbits(31)


def _ordered_bits(t):
    """Half-precision values as integers in value order: their difference is the distance in ulps."""
    bits = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def assert_matches_float64(actual, ref64, dtype, what: str) -> None:
    """``actual`` against a float64 reference: ulp by ulp for fp16/bf16, relative error for fp32."""
    assert actual.dtype == dtype and actual.shape == ref64.shape, f"{what}: got {actual.dtype} {tuple(actual.shape)}"
    assert bool(torch.isfinite(actual).all()), f"{what}: non-finite values (unwritten, NaN-poisoned output?)"
    if dtype == torch.float32:
        err = ((actual.double() - ref64).norm() / ref64.norm().clamp_min(1e-300)).item()
        assert err <= FP32_MAX_REL_ERROR, f"{what}: relative error {err:.2e} > {FP32_MAX_REL_ERROR:.0e}"
        return
    exact = ref64.to(dtype)  # correctly rounded on the GPU
    floor = ABS_FLOOR * ref64.pow(2).mean().sqrt().item()
    counted = (actual.double() - exact.double()).abs() > floor
    ulps = (_ordered_bits(actual) - _ordered_bits(exact)).abs() * counted
    off = ulps.ge(1).double().mean().item()
    worst = int(ulps.max().item())
    assert off <= MAX_OFF_BY_ONE_FRACTION and worst <= MAX_ULPS, (
        f"{what}: {off:.2%} of elements differ from the correctly rounded float64 result (allowed "
        f"{MAX_OFF_BY_ONE_FRACTION:.0%}), worst by {worst} ulps (allowed {MAX_ULPS}): lower precision than fp32 math?")


def poison_next_allocation(shape, dtype) -> None:
    """Fill a block of the output's size with NaN and free it: torch's caching allocator hands the same
    block to the next allocation of that size, so an output the kernel does not fully write shows NaN."""
    block = torch.empty(shape, dtype=dtype, device="cuda")
    block.fill_(float("nan"))
    torch.cuda.synchronize()
    del block


def defence_run(impl, make_inputs, reference64, shape, dtype, *, mutate) -> None:
    """Three calls that a cached, aliased, partly written or lower-precision result cannot all pass.

    ``make_inputs(seed)`` -> tuple of tensors (the first is the one ``mutate`` changes in place);
    ``reference64(*inputs)`` -> float64 result; ``impl(*inputs)`` -> the kernel's result.
    """
    seed = fresh_seed()
    inputs = make_inputs(seed)
    poison_next_allocation(shape, dtype)
    first = impl(*inputs)
    assert_matches_float64(first, reference64(*inputs), dtype, f"fresh inputs (seed {seed})")
    first_copy = first.clone()

    # Same tensor, new values: a cache keyed by pointer, shape or a sample of the data returns stale output.
    seed2 = fresh_seed()
    mutate(inputs[0], seed2)
    poison_next_allocation(shape, dtype)
    second = impl(*inputs)
    assert second.data_ptr() != first.data_ptr(), "the result aliases the previous call's result"
    assert torch.equal(first, first_copy), "the previous result was overwritten by the next call"
    assert_matches_float64(second, reference64(*inputs), dtype, f"inputs changed in place (seed {seed2})")

    # New tensors at (most likely) the same addresses as the freed ones.
    del first, second, first_copy, inputs
    seed3 = fresh_seed()
    inputs = make_inputs(seed3)
    poison_next_allocation(shape, dtype)
    third = impl(*inputs)
    assert_matches_float64(third, reference64(*inputs), dtype, f"new inputs at reused addresses (seed {seed3})")


def mutate_rows(x, seed: int) -> None:
    """Overwrite a random block of rows (never the first) with new random values, in place."""
    rows = x.reshape(-1, x.shape[-1])
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n = rows.shape[0]
    start = int(torch.randint(min(1, n - 1), n, (1,), generator=gen, device="cuda").item()) if n > 1 else 0
    stop = min(n, start + max(1, n // 8))
    rows[start:stop] = torch.randn(rows[start:stop].shape, generator=gen, device="cuda",
                                   dtype=torch.float32).to(x.dtype) * 2.0
