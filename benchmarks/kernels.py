"""Benchmark the bundled cuTile kernels against torch eager and torch.compile (GPU only).

For every case it times, in the same run, the shipped PLAIN kernel and the BEST prepared version
(the step file named by ``best:`` in ``examples/kernels/optimizations/<op>/steps.yaml``, loaded from
its path; the work tree is never changed). Every column comes from this run, timed by
``cutile_perf.bench`` (median of the samples) in one mode: --mode, else ``CUTILE_PERF_BENCH_MODE``,
else cold (L2 flushed, CUDA events). Another mode times the table the way a target's perf tests do
(``cutile-perf init`` prints which one), e.g. ``graph-warm`` for TileGym's cudagraph timer or
``cupti`` for its default CUPTI timer; the header names the mode:

  kernel | version | shape | dtype | cuTile ms | torch eager ms | torch.compile ms | TileGym ms | achieved | % of ceiling | goal

The ceiling is measured in the same run: device-to-device copy bandwidth for memory-bound kernels,
torch.matmul (cuBLAS) for matmul, SDPA with the flash backend for attention. For matmul and attention
the torch eager column IS that ceiling. Goals (GOALS below): memory-bound kernels >= 92 % of copy
bandwidth AND faster than torch.compile AND (with --tilegym) at least as fast as NVIDIA TileGym's own
cuTile kernel; matmul and attention >= 90 % of their ceiling. Each cuTile output is checked against
the torch reference first; a wrong result is reported, never timed.

--tilegym imports TileGym's cuTile ops (``tilegym.ops.cutile``; put TileGym's ``src/`` on PYTHONPATH),
times every launch mode each op offers for the memory-bound cases and reports the fastest, with
its mode in the notes. --precompile N compiles every cuTile version first in N worker processes on
small inputs of the same dtype and row length (same specialization), so the timed run finds them in
cuTile's disk cache; it changes no timing.

Usage:
  python benchmarks/kernels.py              # realistic shapes, plain + best (about two minutes on an H200)
  python benchmarks/kernels.py --quick      # small shapes, short budgets: a smoke run
  python benchmarks/kernels.py --markdown   # a Markdown table for a README
  python benchmarks/kernels.py --all-steps --only softmax   # every prepared step, not only the best
  PYTHONPATH=.tilegym/src python benchmarks/kernels.py --tilegym --only rms_norm   # add TileGym's column
  python benchmarks/kernels.py --markdown --mode cupti       # TileGym's default timing (CUPTI, L2 flushed)
  CUTILE_PERF_BENCH_MODE=graph-warm python benchmarks/kernels.py --markdown   # the same as --mode graph-warm
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "kernels"
sys.path.insert(0, str(SUITE / "src"))  # tilesuite is not installed
sys.path.insert(0, str(ROOT / "scripts"))  # cutile_perf, when not installed

import torch  # noqa: E402

from cutile_perf import bench# noqa: E402
from cutile_perf.judge import stats


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


def tilegym_variants(case: Case) -> list[tuple[str, Callable]]:
    """(mode, function) for each launch mode of TileGym's own cuTile op for this case; [] when it has none.

    Imported lazily: TileGym is optional (its ``src/`` must be on PYTHONPATH). Only its public entry
    points are called, with the arguments its own tests use; eps matches ``torch_reference``."""
    if case.kind != "memory":
        return []
    if case.module == "rms_norm":
        from tilegym.ops.cutile.rms_norm import rms_norm as tg

        return [(f"rms_norm mode={mode}", lambda x, w, mode=mode: tg(x, None, w, 1e-6, mode=mode))
                for mode in ("static_persistent", "multi_wave_reload", "multi_wave_cached")]
    if case.module == "layer_norm":
        from tilegym.ops.cutile.layer_norm_legacy import layer_norm_legacy as tg

        return [("layer_norm_legacy", lambda x, w, b: tg(x, x.shape[-1:], w, b, 1e-5))]
    if case.module == "softmax":
        from tilegym.ops.cutile.softmax import softmax as tg

        return [("softmax default", lambda x: tg(x)), ("softmax use_tma", lambda x: tg(x, use_tma=True)),
                ("softmax use_multi_wave", lambda x: tg(x, use_multi_wave=True))]
    if case.module == "swiglu":
        from tilegym.ops.cutile.swiglu import swiglu as tg

        return [("swiglu", lambda a, b: tg(a, b))]
    return []


def tilegym_column(case: Case, inputs: tuple, expected, budget: dict) -> tuple[float | None, list[str]]:
    """The fastest correct TileGym mode's median ms for this case, and notes naming each mode's time."""
    best, notes = None, []
    try:
        variants = tilegym_variants(case)
    except Exception as exc:  # TileGym not importable: say so once, keep the rest of the table
        return None, [f"TileGym {_error(exc)}"]
    for mode, fn in variants:
        try:
            wrong = check_close(fn(*inputs), expected) if expected is not None else ""
        except Exception as exc:
            notes.append(f"TileGym {mode}: {_error(exc)}")
            continue
        if wrong:
            notes.append(f"TileGym {mode}: {wrong}")
            continue
        ms, note = try_time(lambda: fn(*inputs), budget)
        notes.append(f"TileGym {mode}: {f'{ms:.4f} ms' if ms is not None else note}")
        if ms is not None and (best is None or ms < best):
            best = ms
    return best, notes


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


GOALS = {  # kind -> minimum % of the ceiling measured in the same run
    "memory": 92.0,  # of copy bandwidth; memory-bound kernels must also beat torch.compile and TileGym
    "matmul": 90.0,  # of torch.matmul (cuBLAS)
    "attention": 90.0,  # of SDPA flash
}


def goal_status(kind: str, ceiling_pct: float | None, cutile_ms: float | None, compile_ms: float | None,
                tilegym_ms: float | None = None) -> str:
    """'met', or 'missed: ...' with how far each part of the goal is from being met, or 'n/a'."""
    if ceiling_pct is None or cutile_ms is None:
        return "n/a"
    misses = []
    if ceiling_pct < GOALS[kind]:
        misses.append(f"{GOALS[kind] - ceiling_pct:.1f} pts below {GOALS[kind]:.0f} % of ceiling")
    if kind == "memory" and compile_ms is not None and cutile_ms >= compile_ms:
        misses.append(f"{100.0 * (cutile_ms / compile_ms - 1.0):.1f} % slower than torch.compile")
    if kind == "memory" and tilegym_ms is not None and cutile_ms > tilegym_ms:
        misses.append(f"{100.0 * (cutile_ms / tilegym_ms - 1.0):.1f} % slower than TileGym")
    return "met" if not misses else "missed: " + "; ".join(misses)


def steps_file(op: str) -> dict:
    import yaml

    return yaml.safe_load((SUITE / "optimizations" / op / "steps.yaml").read_text(encoding="utf-8"))


def versions(op: str, all_steps: bool) -> list[tuple[str, Path | None]]:
    """(label, step file) pairs to time: ("plain", None) first, then the best step, or every step."""
    data = steps_file(op)
    best = data.get("best")
    if not best or best not in {step["file"] for step in data["steps"]}:
        raise ValueError(f"optimizations/{op}/steps.yaml: `best: {best}` is not one of its steps")
    names = [step["file"] for step in data["steps"]] if all_steps else [best]
    return [("plain", None)] + [(Path(name).stem + (" (best)" if name == best else ""),
                                 SUITE / "optimizations" / op / name) for name in names]


def load_function(case: Case, path: Path | None) -> Callable:
    """The op's public function from the shipped module, or from a step file loaded by path."""
    if path is None:
        return getattr(importlib.import_module(f"tilesuite.ops.cutile.{case.module}"), case.function)
    spec = importlib.util.spec_from_file_location(f"bench_{case.module}_{path.stem.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, case.function)


def median_ms(fn: Callable, budget: dict) -> float:
    return stats.median(bench.bench(fn, **budget))


def copy_bandwidth_tbps(budget: dict, quick: bool) -> float:
    """Device-to-device copy rate (read + write bytes per second): the memory ceiling of this run."""
    src = torch.empty((256 if quick else 1024) * 2**20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), budget)
    return 2 * src.numel() / (ms * 1e-3) / 1e12


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"


def try_time(fn: Callable, budget: dict) -> tuple[float | None, str]:
    try:
        return median_ms(fn, budget), ""
    except Exception as exc:  # one failing column must not hide the rest of the table
        return None, _error(exc)


def check_close(actual, expected) -> str:
    """'' when the cuTile output matches the torch reference, else what differs. Bounds are loose
    (bf16-level, absolute part scaled by the output's magnitude): this catches a broken kernel, while
    the suite's tests (tests/ops/) hold the per-dtype tolerances."""
    if actual.shape != expected.shape:
        return f"WRONG shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.float(), expected.float()
    if not torch.allclose(a, e, atol=2e-2 * e.abs().max().item(), rtol=2e-2):
        return f"WRONG result (max abs diff {(a - e).abs().max().item():.3g})"
    return ""


def torch_columns(case: Case, inputs: tuple, budget: dict, tilegym: bool = False) -> dict:
    """Eager, torch.compile (one compiled function per shape) and, with ``tilegym``, TileGym times for
    one case, plus the reference output."""
    ref = torch_reference(case)
    eager_ms, eager_note = try_time(lambda: ref(*inputs), budget)
    compiled = torch.compile(ref)
    compile_ms, compile_note = try_time(lambda: compiled(*inputs), budget)
    notes = ([f"eager {eager_note}"] if eager_note else []) + ([f"compile {compile_note}"] if compile_note else [])
    try:
        expected = ref(*inputs)
    except Exception:  # already reported in the eager column's note; the cuTile rows go unchecked
        expected = None
    tilegym_ms = None
    if tilegym and case.kind == "memory":
        tilegym_ms, tilegym_notes = tilegym_column(case, inputs, expected, budget)
        notes += tilegym_notes
    return {"eager_ms": eager_ms, "compile_ms": compile_ms, "tilegym_ms": tilegym_ms, "expected": expected,
            "notes": notes}


def run_version(case: Case, label: str, path: Path | None, inputs: tuple, ref: dict, budget: dict,
                copy_tbps: float) -> dict:
    row = {"kernel": case.kernel, "version": label, "shape": "x".join(map(str, case.shape)),
           "dtype": str(case.dtype).replace("torch.", ""), "eager_ms": ref["eager_ms"],
           "compile_ms": ref["compile_ms"], "tilegym_ms": ref.get("tilegym_ms"), "cutile_ms": None, "achieved": "", "ceiling_pct": None,
           "notes": list(ref["notes"]) if label == "plain" else []}
    try:
        fn = load_function(case, path)
        call = (lambda: fn(*inputs, causal=case.causal)) if case.kind == "attention" else (lambda: fn(*inputs))
        out = call()
        wrong = check_close(out, ref["expected"]) if ref["expected"] is not None else ""
    except Exception as exc:  # a version that does not import, compile or run is a result to show
        row["notes"].append(f"cuTile {_error(exc)}")
        row["goal"] = "n/a"
        return row
    if wrong:
        row["notes"].append(f"cuTile {wrong}")
        row["goal"] = "wrong result"
        return row
    cutile_ms, note = try_time(call, budget)
    row["notes"] += [f"cuTile {note}"] if note else []
    units = work_units(case, inputs)
    row["cutile_ms"] = cutile_ms
    if cutile_ms is not None and case.kind == "memory":
        tbps = units / (cutile_ms * 1e-3) / 1e12
        row.update(achieved=f"{tbps:.2f} TB/s", ceiling_pct=100.0 * tbps / copy_tbps)
    elif cutile_ms is not None:
        tflops = units / (cutile_ms * 1e-3) / 1e12
        ceiling = units / (ref["eager_ms"] * 1e-3) / 1e12 if ref["eager_ms"] else None
        row.update(achieved=f"{tflops:.0f} TFLOP/s", ceiling_pct=100.0 * tflops / ceiling if ceiling else None)
    row["goal"] = goal_status(case.kind, row["ceiling_pct"], cutile_ms, ref["compile_ms"], ref.get("tilegym_ms"))
    return row


def run_case(case: Case, budget: dict, copy_tbps: float, all_steps: bool, tilegym: bool = False) -> list[dict]:
    inputs = make_inputs(case)
    ref = torch_columns(case, inputs, budget, tilegym)
    return [run_version(case, label, path, inputs, ref, budget, copy_tbps)
            for label, path in versions(case.module, all_steps)]


def small(case: Case) -> Case:
    """The case with 512 rows: the same dtype, row length and shape divisibility (so the same compiled
    specialization) at a fraction of the memory; matmul and attention are left as they are."""
    if case.kind != "memory":
        return case
    return dataclasses.replace(case, shape=(512, *case.shape[1:]))


def _compile_version(job: tuple) -> str:
    """Worker: run one version once on small inputs so cuTile compiles it into its disk cache."""
    case, path = job
    try:
        load_function(case, path)(*make_inputs(small(case)))
        torch.cuda.synchronize()
        return ""
    except Exception as exc:  # reported by the timed run itself; here it only costs the warm-up
        return f"{case.kernel} {path.name if path else 'plain'}: {_error(exc)}"


def run_pool(worker: Callable, jobs: list, processes: int) -> list:
    """worker(job) for every job in `processes` spawned processes (CUDA needs spawn, not fork)."""
    import multiprocessing

    if processes < 1 or not jobs:
        return []
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return pool.map(worker, jobs, chunksize=1)


def precompile(cases: list[Case], all_steps: bool, processes: int) -> list[str]:
    """Compile the cuTile versions of the memory-bound cases in parallel; returns the failures."""
    jobs = [(case, path) for case in cases if case.kind == "memory" for _, path in versions(case.module, all_steps)]
    return [err for err in run_pool(_compile_version, jobs, processes) if err]


COLUMNS = ["kernel", "version", "shape", "dtype", "cuTile (ms)", "torch eager (ms)", "torch.compile (ms)",
           "TileGym (ms)", "achieved", "% of ceiling", "goal"]


def render(rows: list[dict], header: str, markdown: bool) -> str:
    def fmt(v, pct=False):
        if v is None or v == "":
            return "n/a"
        return f"{v:.1f} %" if pct else (f"{v:.4f}" if isinstance(v, float) else str(v))

    table = [[r["kernel"], r["version"], r["shape"], r["dtype"], fmt(r["cutile_ms"]), fmt(r["eager_ms"]),
              fmt(r["compile_ms"]), fmt(r.get("tilegym_ms")), fmt(r["achieved"]), fmt(r["ceiling_pct"], pct=True), r["goal"]] for r in rows]
    notes = [f"- {r['kernel']} {r['version']} {r['shape']}: {n}" for r in rows for n in r["notes"]]
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(r) + " |" for r in table]
    else:
        widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(COLUMNS)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in table]
    return "\n".join([header, "", *lines, *([""] + notes if notes else [])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes and short budgets (smoke run)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--all-steps", action="store_true",
                        help="time every prepared step of steps.yaml, not only the `best:` one")
    parser.add_argument("--only", action="append", default=[], metavar="KERNEL",
                        help="run only rows whose kernel name starts with this (repeatable)")
    parser.add_argument("--tilegym", action="store_true",
                        help="add a column with NVIDIA TileGym's own cuTile kernel (its src/ on PYTHONPATH)")
    parser.add_argument("--precompile", type=int, default=0, metavar="N",
                        help="compile the memory-bound cuTile versions first in N processes (disk cache)")
    parser.add_argument("--mode", choices=bench.MODES, default=None,
                        help="cutile_perf.bench mode for every column (default: CUTILE_PERF_BENCH_MODE, else cold)")
    args = parser.parse_args(argv)
    try:
        mode = bench.check_mode(args.mode)
    except ValueError as exc:  # a CUTILE_PERF_BENCH_MODE typo
        print(f"benchmarks/kernels.py: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 3
    budget = {"warmup_ms": 10.0, "rep_ms": 30.0, "max_reps": 200} if args.quick else {}
    budget["mode"] = mode
    cases = [c for c in (QUICK_CASES if args.quick else FULL_CASES)
             if not args.only or any(c.kernel.startswith(o) for o in args.only)]
    for failure in precompile(cases, args.all_steps, args.precompile):
        print(f"precompile: {failure}", file=sys.stderr)
    copy_tbps = copy_bandwidth_tbps(budget, args.quick)
    rows = []
    for case in cases:
        print(f"... {case.kernel} {'x'.join(map(str, case.shape))}", file=sys.stderr, flush=True)
        rows.extend(run_case(case, budget, copy_tbps, args.all_steps, args.tilegym))
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    timer, flushed = bench.MODE_TIMERS[mode]
    how = {"events": "CUDA events", "cuda-graph": "CUDA graph replay timed by events", "cupti": "CUPTI kernel time"}[timer]
    header = (f"{props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}; times: median, "
              f"{'cold' if flushed else 'warm'} L2, {how} (cutile_perf.bench, mode {mode}"
              f"{'' if flushed else '; a shape that fits in L2 can pass the copy ceiling'}). "
              f"Memory ceiling = copy {copy_tbps:.2f} TB/s; "
              "matmul ceiling = torch.matmul; attention ceiling = SDPA flash. Goal: memory-bound >= "
              f"{GOALS['memory']:.0f} % of copy, faster than torch.compile and not slower than TileGym; "
              f"matmul/attention >= "
              f"{GOALS['matmul']:.0f} % of ceiling. version: plain = shipped kernel, else the step file.")
    print(render(rows, header, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
