"""Honest control of checked timing (issue 39 item 6): every bundled prepared step through the loop.

    source .gpu/setup.sh && export PYTHONPATH=$PWD/scripts:$PYTHONPATH
    python benchmarks/honest_controls.py --kernels rms_norm,softmax --budget 540 --out $OUT/controls

Each bundled kernel with prepared steps (``examples/kernels/optimizations/<op>/steps.yaml``) runs
``cutile-perf demo --kernel <op>``: init, baseline, one ``try`` per step, with checked timed calls on
as always. The steps are honest optimizations (none computes a different result), so a row whose
reason names ``wrong-when-timed``, ``implausible`` or ``wrong-result``, or a ``tampered`` crash, is
a false alarm. Prints one table line per step and the count; each demo's log is copied to
``--out``. Exit 1 on any false alarm, 2 when a kernel did not finish (time budget, demo error).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "examples" / "kernels" / "optimizations"
DEMO_LOG = ROOT / "sandbox" / "demo" / "sandbox" / "experiments.jsonl"
ALARMS = ("wrong-when-timed", "implausible", "wrong-result")


def prepared_kernels() -> list[str]:
    return sorted(p.parent.name for p in STEPS.glob("*/steps.yaml"))


def false_alarm(row: dict) -> str:
    """Why this honest row is a false alarm, or "" (pure)."""
    said = f"{row.get('crash_class') or ''} {row.get('reason') or ''}"
    for word in (*ALARMS, "tampered"):
        if word in said:
            return word
    return ""


def step_lines(kernel: str, rows: list[dict]) -> list[dict]:
    """One summary per try row of a demo's log, the baseline's row left out (pure)."""
    return [{"kernel": kernel, "step": str(row.get("optimization", ""))[:60], "decision": row.get("status"),
             "checked": row.get("checked"), "false_alarm": false_alarm(row), "reason": str(row.get("reason", ""))[:160]}
            for row in rows if row.get("iteration", 0) > 0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=",".join(prepared_kernels()), help="comma-separated ops with steps.yaml")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds; kernels past it are skipped and say so")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(kernels) - set(prepared_kernels()))
    if unknown:
        parser.error(f"no prepared steps for {', '.join(unknown)}; have {', '.join(prepared_kernels())}")
    args.out.mkdir(parents=True, exist_ok=True)
    began, lines, unfinished = time.monotonic(), [], []
    for kernel in kernels:
        left = args.budget - (time.monotonic() - began)
        if left < 60:
            unfinished.append(f"{kernel}: skipped, {left:.0f} s of the budget left")
            continue
        shutil.rmtree(DEMO_LOG.parents[1], ignore_errors=True)
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-m", "cutile_perf", "demo", "--kernel", kernel, "--json"],
                                  cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=left)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        rows = [json.loads(x) for x in DEMO_LOG.read_text().splitlines() if x.strip()] if DEMO_LOG.exists() else []
        if DEMO_LOG.exists():
            shutil.copy(DEMO_LOG, args.out / f"{kernel}-experiments.jsonl")
        mine = step_lines(kernel, rows)
        lines += mine
        print(f"{kernel}: demo exit {code}, {len(mine)} tries, {time.monotonic() - started:.0f} s", flush=True)
        if code != 0:
            unfinished.append(f"{kernel}: demo exit {code}")
    for line in lines:
        print(json.dumps(line))
    alarms = [line for line in lines if line["false_alarm"]]
    summary = {"tries": len(lines), "false_alarms": len(alarms), "unfinished": unfinished,
               "kernels": kernels, "seconds": round(time.monotonic() - began, 1)}
    print(json.dumps(summary))
    (args.out / "summary.json").write_text(json.dumps({"summary": summary, "tries": lines}, indent=1))
    return 1 if alarms else 2 if unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
