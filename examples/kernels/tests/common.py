"""Helpers shared by the op tests: tolerances, input generation, GPU skip, benchmark records.

A new op test imports this module (``from tests import common``) and follows test_rms_norm.py:
``test_op`` parametrized over ``backend`` (id ``cutile``) for correctness, ``test_perf`` over
``framework`` (``cutile``, ``pytorch``) that checks correctness first, then calls
``record_benchmark``.
"""
from __future__ import annotations

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


def record_benchmark(record_property, framework: str, fn, **bench_kwargs) -> dict:
    """Time ``fn`` with cutile-perf's one timing method and record TileGym's benchmark dict.

    The record ``{framework: {"forward": {mean, std, rel_std, median, min, max, nrep, peak_mem_mb}}}``
    is stored with ``record_property("benchmark", ...)``, exactly where TileGym puts it, so the
    harness reads these tests like TileGym's. Times are milliseconds; rel_std is in percent.
    """
    try:
        from cutile_perf.bench import bench_record
    except ImportError as exc:  # the perf tests are meaningless without the shared timing method
        raise ImportError("perf tests need cutile_perf importable (pip install -e <cutile-perf checkout>)") from exc
    record = {framework: {"forward": bench_record(fn, **bench_kwargs)}}
    record_property("benchmark", record)
    return record
