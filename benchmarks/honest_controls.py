"""Honest control of checked timing (issue 39 item 6): every bundled prepared step through the loop.

    source .gpu/setup.sh && export PYTHONPATH=$PWD/scripts:$PYTHONPATH
    python benchmarks/honest_controls.py --kernels rms_norm,softmax --budget 540 --out $OUT/controls

Each bundled kernel with prepared steps (``examples/kernels/optimizations/<op>/steps.yaml``) runs
the demo (``loop.demo.demo``, as ``cutile-perf demo --kernel <op>``, in a folder of its own): init,
baseline, one ``try`` per step, with checked timed calls on as always. The steps are honest
optimizations (none computes a different result), so a row whose reason names ``wrong-when-timed``,
``implausible`` or ``wrong-result``, or a ``tampered`` crash, is a false alarm. Prints one line per
kernel as its demo ends, then one per step and the count; each demo's log and output are saved to
``--out`` as it ends. Exit 1 on any false alarm, 2 when a kernel did not finish (time budget, demo
error).

``--parallel N`` runs N demos side by side on the one GPU, to spend less device time: a harder
condition for timing, not for correctness. Their keep/revert verdicts then say little; only the
false alarms count, and the results must say the demos shared the GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "examples" / "kernels" / "optimizations"
# The demo through the library (the CLI has no destination flag). SIGTERM is made an interruption
# as the CLI makes it (cli.sigterm_as_interrupt), so a demo ended for time settles its try.
DEMO_CODE = """
import signal, sys
from pathlib import Path
from cutile_perf.cli import sigterm_as_interrupt
from cutile_perf.loop.demo import demo
signal.signal(signal.SIGTERM, sigterm_as_interrupt)
demo(kernel=sys.argv[1], dest=Path(sys.argv[2]))
"""
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


def run_demo(kernel: str, dest: Path, timeout: float, out: Path) -> tuple[object, list[dict]]:
    """One demo in its own folder (so several can run side by side): its exit code and log rows.

    Past ``timeout`` the demo gets SIGTERM, which the loop handles as Ctrl-C (it ends its children's
    process groups and logs the try as interrupted), and SIGKILL 30 s later: a demo cut short must not
    leave children on the GPU beside the others. Its output goes to ``<out>/<kernel>-demo.txt``."""
    with open(out / f"{kernel}-demo.txt", "w") as text:
        child = subprocess.Popen([sys.executable, "-c", DEMO_CODE, kernel, str(dest)], cwd=ROOT, env=dict(os.environ),
                                 stdout=text, stderr=subprocess.STDOUT)
        try:
            exit_code: object = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            exit_code = "timeout"
    log = dest / "sandbox" / "experiments.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
    return exit_code, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=",".join(prepared_kernels()), help="comma-separated ops with steps.yaml")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds; kernels past it are skipped and say so")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="demos side by side on the one GPU (a harder timing condition; default 1)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(kernels) - set(prepared_kernels()))
    if unknown:
        parser.error(f"no prepared steps for {', '.join(unknown)}; have {', '.join(prepared_kernels())}")
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="honest-controls-"))
    began, lines, unfinished, lock = time.monotonic(), [], [], threading.Lock()

    def control(kernel: str) -> None:
        left = args.budget - (time.monotonic() - began)
        if left < 60:
            with lock:
                unfinished.append(f"{kernel}: skipped, {left:.0f} s of the budget left")
            return
        started = time.monotonic()
        code, rows = run_demo(kernel, work / kernel, left, args.out)
        mine = step_lines(kernel, rows)
        with lock:  # each finished demo is saved at once: a call cut later still has it
            (args.out / f"{kernel}-experiments.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            lines.extend(mine)
            if code != 0:
                unfinished.append(f"{kernel}: demo exit {code}")
            print(f"{kernel}: demo exit {code}, {len(mine)} tries, {time.monotonic() - started:.0f} s", flush=True)
            save(args.out, kernels, lines, unfinished, began)

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        list(pool.map(control, kernels))
    for line in lines:
        print(json.dumps(line))
    summary = save(args.out, kernels, lines, unfinished, began)
    print(json.dumps(summary))
    return 1 if summary["false_alarms"] else 2 if unfinished else 0


def save(out: Path, kernels: list[str], lines: list[dict], unfinished: list[str], began: float) -> dict:
    summary = {"tries": len(lines), "false_alarms": sum(1 for line in lines if line["false_alarm"]),
               "unfinished": unfinished, "kernels": kernels, "seconds": round(time.monotonic() - began, 1)}
    (out / "summary.json").write_text(json.dumps({"summary": summary, "tries": lines}, indent=1))
    return summary


if __name__ == "__main__":
    sys.exit(main())
