"""Profile the memory-bound kernels' last gap to torch.compile with Nsight Compute (GPU, ``ncu`` on PATH).

``benchmarks/kernels.py`` times each version; this script says why one is faster than another. For
each case it launches, once each inside a CUDA profiler range: the shipped best step, any extra
sweep configs named by ``--sweep`` (``benchmarks/kernel_sweep.py`` round 5 labels; a label names the
config in every case that has it) and torch.compile of the same reference. No copy reference: a
device-to-device ``copy_`` is a memcpy, not a kernel, so ncu does not profile it (DRAM % of peak is
the bandwidth yardstick here). Rows are labelled by launch order; the kernel name column shows
which kernel each really is. Run
without ``--emit`` it starts ``ncu`` on itself (``--profile-from-start off``, ``--clock-control none``
so clocks run as in a timing run, caches flushed before each kernel as ``cutile_perf.bench`` does) and
prints one row per kernel: duration, DRAM bytes and throughput, launch shape, registers, achieved
occupancy, instructions executed and the main warp stall reasons.

Usage:
  python benchmarks/profile_gap.py --out prof/            # ncu over every case; table + raw CSV in prof/
  python benchmarks/profile_gap.py --only swiglu --out prof/
  TORCH_LOGS=output_code python benchmarks/profile_gap.py --emit 2> inductor.txt   # Inductor's Triton code
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels as kb  # noqa: E402  (benchmarks/kernels.py: cases, inputs, references, step loading)

# The README shapes where torch.compile was still faster (benchmarks/kernels.py, 2026-12-01).
GAP_SHAPES = {("rms_norm", (262144, 1024)), ("layer_norm", (262144, 1024)), ("swiglu", (8192, 14336))}
CASES = [c for c in kb.FULL_CASES if (c.module, c.shape) in GAP_SHAPES]

# ncu metric -> column. Chosen to separate "moves fewer bytes", "keeps more bytes in flight"
# (occupancy, waves) and "spends more instructions per byte" (inst executed, stalls).
METRICS = {
    "gpu__time_duration.sum": "time",
    "dram__bytes_read.sum": "DRAM read",
    "dram__bytes_write.sum": "DRAM write",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM % peak",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "launch__registers_per_thread": "regs",
    "launch__waves_per_multiprocessor": "waves",
    "sm__maximum_warps_per_active_cycle_pct": "occ theor %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occ achieved %",
    "smsp__inst_executed.sum": "inst",
}
# Warp stalls per issued instruction (ncu's WarpStateStats names). Optional: if this ncu does not know
# a name, the profile is taken again without them rather than lost.
STALLS = {
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "stall long-sb",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio": "stall lg-throttle",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "stall barrier",
}


def versions(case, sweep_labels: list[str]) -> list[tuple[str, object]]:
    """(label, function) for one case, in launch order."""
    import torch

    _, best_path = kb.versions(case.module, all_steps=False)[1]
    out = [(f"cuTile {best_path.stem}", kb.load_function(case, best_path))]
    if sweep_labels:
        import kernel_sweep as ks

        for cfg in ks.configs_for(case, {5}):
            if cfg.label() in sweep_labels:
                out.append((f"sweep {cfg.label()}", ks.function_for(case, cfg)))
    out.append(("torch.compile", torch.compile(kb.torch_reference(case))))
    return out


def emit(cases, sweep_labels: list[str], order_file: Path | None) -> None:
    """Warm every version up (compiles, checks), then launch each once inside the profiler range."""
    import torch

    plan = []
    for case in cases:
        inputs = kb.make_inputs(case)
        expected = kb.torch_reference(case)(*inputs)
        for label, fn in versions(case, sweep_labels):
            result = fn(*inputs)
            wrong = kb.check_close(result, expected)
            if wrong:
                print(f"{case.kernel}: {label}: {wrong}", file=sys.stderr)
            plan.append((f"{case.kernel} {'x'.join(map(str, case.shape))}", label, fn, inputs))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, _, fn, inputs in plan:
        fn(*inputs)
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    if order_file:
        order_file.write_text(json.dumps([[case, label] for case, label, _, _ in plan]))


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu ``--csv`` (details page, one line per kernel and metric) -> one dict per kernel, in order."""
    start = text.find('"ID"')
    if start < 0:
        return []
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        k = kernels.setdefault(row["ID"], {"name": row.get("Kernel Name", "")})
        k[row["Metric Name"]] = (row["Metric Value"], row.get("Metric Unit", ""))
    return [kernels[i] for i in sorted(kernels, key=int)]


def _number(value: str) -> float | None:
    try:
        return float(value.replace(",", ""))
    except ValueError:
        return None


def render(kernels: list[dict], order: list[list[str]], metrics: dict[str, str]) -> str:
    """A Markdown table, one row per profiled kernel, labelled by launch order."""
    if len(kernels) != len(order):
        print(f"warning: {len(kernels)} kernels profiled for {len(order)} launches; labels by position may be off",
              file=sys.stderr)
    head = ["case", "version", "kernel"] + list(metrics.values())
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, k in enumerate(kernels):
        case, label = order[i] if i < len(order) else ("?", "?")
        cells = [case, label, k["name"][:40]]
        for metric in metrics:
            value, unit = k.get(metric, ("", ""))
            num = _number(value)
            if num is not None and unit in ("byte", "Kbyte", "Mbyte", "Gbyte"):
                num *= {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}[unit]
                cells.append(f"{num:.1f} MB")
            elif num is not None and unit in ("nsecond", "usecond", "msecond"):
                num *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}[unit]
                cells.append(f"{num:.1f} us")
            else:
                cells.append(f"{value} {unit}".strip() if value else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile(args, out: Path) -> int:
    ncu = shutil.which("ncu")
    if not ncu:
        print("benchmarks/profile_gap.py: ncu (Nsight Compute) is not on PATH", file=sys.stderr)
        return 3
    order_file = out / "launch_order.json"
    me = [sys.executable, str(Path(__file__).resolve()), "--emit", "--order-file", str(order_file)]
    me += [a for o in args.only for a in ("--only", o)] + [a for s in args.sweep for a in ("--sweep", s)]
    metrics = {**METRICS, **STALLS}
    for attempt in (1, 2):
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--cache-control", "all",
               "--csv", "--metrics", ",".join(metrics), *me]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TORCH_LOGS": ""})
        if attempt == 1 and proc.returncode != 0 and "metric" in proc.stderr.lower():
            (out / "ncu-first-attempt.stderr").write_text(proc.stderr)
            metrics = dict(METRICS)
            continue
        break
    (out / "ncu.csv").write_text(proc.stdout)
    (out / "ncu.stderr").write_text(proc.stderr)
    kernels = parse_ncu_csv(proc.stdout)
    if proc.returncode != 0 or not kernels:
        print(f"ncu exited {proc.returncode} with {len(kernels)} kernels; see {out}/ncu.stderr:\n"
              + "\n".join(proc.stderr.splitlines()[-15:]), file=sys.stderr)
        return 1
    order = json.loads(order_file.read_text()) if order_file.is_file() else []
    table = render(kernels, order, metrics)
    (out / "table.md").write_text(table + "\n")
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], metavar="KERNEL", help="cases whose kernel starts with this")
    parser.add_argument("--sweep", action="append", default=[], metavar="LABEL",
                        help="also profile this kernel_sweep.py round-5 config (its exact label)")
    parser.add_argument("--emit", action="store_true", help="launch the versions (what ncu runs); no profiling")
    parser.add_argument("--order-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("profile-gap"), help="folder for the table and raw CSV")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or any(c.kernel.startswith(o) for o in args.only)]
    if args.emit:
        import torch

        if not torch.cuda.is_available():
            print("benchmarks/profile_gap.py needs a CUDA GPU (torch sees none)", file=sys.stderr)
            return 3
        emit(cases, args.sweep, args.order_file)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    return profile(args, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
