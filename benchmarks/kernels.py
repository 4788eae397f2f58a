"""Benchmark the bundled cuTile kernels against torch eager and torch.compile (GPU only).

Prints one table; every column comes from this run, timed by ``cutile_perf.bench`` (cold L2, CUDA
events, median of the samples):

  kernel | shape | dtype | cuTile ms | torch eager ms | torch.compile ms | achieved | % of ceiling

The ceiling is measured in the same run: device-to-device copy bandwidth for memory-bound kernels,
torch.matmul (cuBLAS) for matmul, SDPA with the flash backend for attention. For matmul and attention
the torch eager column IS that ceiling.

Usage:
  python benchmarks/kernels.py              # realistic shapes (about a minute on an H200)
  python benchmarks/kernels.py --quick      # small shapes, short budgets: a smoke run
  python benchmarks/kernels.py --markdown   # a Markdown table for a README
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "kernels" / "src"))  # tilesuite is not installed
sys.path.insert(0, str(ROOT / "scripts"))  # cutile_perf, when not installed

import torch  # noqa: E402

from cutile_perf import bench, stats  # noqa: E402


@dataclass(frozen=True)
class Case:
    kernel: str  # row label
    module: str  # tilesuite.ops.cutile.<module>
    function: str  # public function in that module
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # "memory", "matmul" or "attention": picks the work unit and the ceiling
    causal: bool = False


FULL_CASES = [
    Case("rms_norm", "rms_norm", "rms_norm", (262144, 1024), torch.float16, "memory"),
    Case("rms_norm", "rms_norm", "rms_norm", (65536, 4096), torch.bfloat16, "memory"),
    Case("layer_norm", "layer_norm", "layer_norm", (262144, 1024), torch.float16, "memory"),
    Case("softmax", "softmax", "softmax", (32768, 4096), torch.float16, "memory"),
    Case("swiglu", "swiglu", "swiglu", (8192, 14336), torch.bfloat16, "memory"),
    Case("matmul", "matmul", "matmul", (4096, 4096, 4096), torch.bfloat16, "matmul"),
    Case("matmul", "matmul", "matmul", (8192, 8192, 8192), torch.bfloat16, "matmul"),
    Case("fmha", "attention", "fmha", (4, 16, 4096, 128), torch.bfloat16, "attention"),
    Case("fmha causal", "attention", "fmha", (4, 16, 4096, 128), torch.bfloat16, "attention", causal=True),
]
QUICK_CASES = [
    Case("rms_norm", "rms_norm", "rms_norm", (16384, 1024), torch.float16, "memory"),
    Case("layer_norm", "layer_norm", "layer_norm", (16384, 1024), torch.float16, "memory"),
    Case("softmax", "softmax", "softmax", (4096, 4096), torch.float16, "memory"),
    Case("swiglu", "swiglu", "swiglu", (1024, 14336), torch.bfloat16, "memory"),
    Case("matmul", "matmul", "matmul", (2048, 2048, 2048), torch.bfloat16, "matmul"),
    Case("fmha causal", "attention", "fmha", (1, 8, 1024, 64), torch.bfloat16, "attention", causal=True),
]


def make_inputs(case: Case) -> tuple:
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(case.dtype)

    if case.kind == "matmul":
        m, n, k = case.shape
        return randn(m, k), randn(k, n)
    if case.kind == "attention":
        return randn(*case.shape), randn(*case.shape), randn(*case.shape)
    rows, cols = case.shape
    if case.module == "rms_norm":
        return randn(rows, cols), randn(cols)
    if case.module == "layer_norm":
        return randn(rows, cols), randn(cols), randn(cols)
    if case.module == "swiglu":
        return randn(rows, cols), randn(rows, cols)
    return (randn(rows, cols),)


def torch_reference(case: Case) -> Callable:
    """The eager PyTorch computation of the same op (compiled as-is for the torch.compile column)."""
    if case.module == "rms_norm":
        return lambda x, w: w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
    if case.module == "layer_norm":
        return lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5)
    if case.module == "softmax":
        return lambda x: torch.softmax(x, dim=-1)
    if case.module == "swiglu":
        return lambda a, b: torch.nn.functional.silu(a) * b
    if case.kind == "matmul":
        return torch.matmul
    return lambda q, k, v: _sdpa_flash(q, k, v, case.causal)


def _sdpa_flash(q, k, v, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def work_units(case: Case, inputs: tuple) -> float:
    """Bytes moved (memory-bound) or floating-point operations (matmul, attention)."""
    if case.kind == "matmul":
        m, n, k = case.shape
        return 2.0 * m * n * k
    if case.kind == "attention":
        b, h, s, d = case.shape
        return 4.0 * b * h * s * s * d * (0.5 if case.causal else 1.0)
    elem = inputs[0].element_size()
    big = inputs[0].numel()
    n_big_inputs = 2 if case.module == "swiglu" else 1
    small = sum(t.numel() for t in inputs[n_big_inputs:])
    return float(elem * ((n_big_inputs + 1) * big + small))  # inputs read once, output written once


def median_ms(fn: Callable, budget: dict) -> float:
    return stats.median(bench.bench(fn, **budget))


def copy_bandwidth_tbps(budget: dict, quick: bool) -> float:
    """Device-to-device copy rate (read + write bytes per second): the memory ceiling of this run."""
    src = torch.empty((256 if quick else 1024) * 2**20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), budget)
    return 2 * src.numel() / (ms * 1e-3) / 1e12


def try_time(fn: Callable, budget: dict) -> tuple[float | None, str]:
    try:
        return median_ms(fn, budget), ""
    except Exception as exc:  # one failing column must not hide the rest of the table
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"


def run_case(case: Case, budget: dict, copy_tbps: float) -> dict:
    row = {"kernel": case.kernel, "shape": "x".join(map(str, case.shape)),
           "dtype": str(case.dtype).replace("torch.", ""), "notes": []}
    inputs = make_inputs(case)
    ref = torch_reference(case)
    eager_ms, note = try_time(lambda: ref(*inputs), budget)
    row["notes"] += [f"eager {note}"] if note else []
    compiled = torch.compile(ref)
    compile_ms, note = try_time(lambda: compiled(*inputs), budget)
    row["notes"] += [f"compile {note}"] if note else []
    try:
        fn = getattr(importlib.import_module(f"tilesuite.ops.cutile.{case.module}"), case.function)
    except (ImportError, AttributeError) as exc:  # K2's kernels may be absent: the row still prints
        fn, cutile_ms = None, None
        row["notes"].append(f"cuTile kernel missing ({type(exc).__name__})")
    if fn is not None:
        call = (lambda: fn(*inputs, causal=case.causal)) if case.kind == "attention" else (lambda: fn(*inputs))
        cutile_ms, note = try_time(call, budget)
        row["notes"] += [f"cuTile {note}"] if note else []
    units = work_units(case, inputs)
    row.update(cutile_ms=cutile_ms, eager_ms=eager_ms, compile_ms=compile_ms)
    if cutile_ms is None:
        row.update(achieved="", ceiling_pct=None)
    elif case.kind == "memory":
        tbps = units / (cutile_ms * 1e-3) / 1e12
        row.update(achieved=f"{tbps:.2f} TB/s", ceiling_pct=100.0 * tbps / copy_tbps)
    else:
        tflops = units / (cutile_ms * 1e-3) / 1e12
        ceiling = units / (eager_ms * 1e-3) / 1e12 if eager_ms else None
        row.update(achieved=f"{tflops:.0f} TFLOP/s", ceiling_pct=100.0 * tflops / ceiling if ceiling else None)
    return row


def render(rows: list[dict], header: str, markdown: bool) -> str:
    cols = ["kernel", "shape", "dtype", "cuTile (ms)", "torch eager (ms)", "torch.compile (ms)", "achieved",
            "% of ceiling"]

    def fmt(v, pct=False):
        if v is None or v == "":
            return "n/a"
        return f"{v:.1f} %" if pct else (f"{v:.4f}" if isinstance(v, float) else str(v))

    table = [[r["kernel"], r["shape"], r["dtype"], fmt(r["cutile_ms"]), fmt(r["eager_ms"]), fmt(r["compile_ms"]),
              fmt(r["achieved"]), fmt(r["ceiling_pct"], pct=True)] for r in rows]
    notes = [f"- {r['kernel']} {r['shape']}: {n}" for r in rows for n in r["notes"]]
    if markdown:
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(r) + " |" for r in table]
    else:
        widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(cols)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in table]
    return "\n".join([header, "", *lines, *([""] + notes if notes else [])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes and short budgets (smoke run)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--only", action="append", default=[], metavar="KERNEL",
                        help="run only rows whose kernel name starts with this (repeatable)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 3
    budget = {"warmup_ms": 10.0, "rep_ms": 30.0, "max_reps": 200} if args.quick else {}
    cases = [c for c in (QUICK_CASES if args.quick else FULL_CASES)
             if not args.only or any(c.kernel.startswith(o) for o in args.only)]
    copy_tbps = copy_bandwidth_tbps(budget, args.quick)
    rows = []
    for case in cases:
        print(f"... {case.kernel} {'x'.join(map(str, case.shape))}", file=sys.stderr, flush=True)
        rows.append(run_case(case, budget, copy_tbps))
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    header = (f"{props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}; times: median, cold L2, "
              f"CUDA events (cutile_perf.bench). Memory ceiling = copy {copy_tbps:.2f} TB/s; "
              "matmul ceiling = torch.matmul; attention ceiling = SDPA flash.")
    print(render(rows, header, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
