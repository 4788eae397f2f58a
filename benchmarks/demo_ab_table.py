"""The A/B table of ``benchmarks/demo_ab.sh``'s runs, when its demos were cut short on purpose.

A whole demo takes about two minutes, so three runs per arm do not fit one 600 s GPU call; cut at
``DEMO_TIMEOUT`` seconds, every run still passes the same first steps. This reads each run's
``demo.txt`` (every line stamped with its seconds since the start) and compares the arms at the
last step every run reached: when it began is when the baseline and the steps before it ended.

    python benchmarks/demo_ab_table.py OUT/spares

prints one row per run (its version, and when each step began) and, per version, the median time
to that common step, with the ratio of medians against the first version named in the runs.
"""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

STEP = re.compile(r"^\s*(\d+\.\d+) cutile-perf: step (\d+)/\d+:")
BASELINE = re.compile(r"^\s*(\d+\.\d+) cutile-perf: baseline ")


def step_starts(text: str) -> dict[int, float]:
    """Seconds since the demo's start at which each step began; step 0 is the baseline."""
    starts: dict[int, float] = {}
    for line in text.splitlines():
        if m := BASELINE.match(line):
            starts.setdefault(0, float(m.group(1)))
        elif m := STEP.match(line):
            starts.setdefault(int(m.group(2)), float(m.group(1)))
    return starts


def version_of(run_dir: Path) -> str:
    """``1-new-nospares`` -> ``new+nospares`` (``demo_ab.sh`` names each run's folder N-version)."""
    return run_dir.name.split("-", 1)[1].replace("-", "+", 1) if "-" in run_dir.name else run_dir.name


def table(runs: list[tuple[str, dict[int, float]]]) -> list[str]:
    """The per-run rows, then each version's median time to the last step every run reached."""
    if not runs:
        return ["no runs"]
    common = min(max(starts, default=0) for _, starts in runs)
    deepest = max(max(starts, default=0) for _, starts in runs)
    lines = ["| run | version | " + " | ".join(f"step {k}" for k in range(1, deepest + 1)) + " |",
             "|---|---|" + "---|" * deepest]
    for n, (version, starts) in enumerate(runs, 1):
        cells = [f"{starts[k]:.1f}" if k in starts else "" for k in range(1, deepest + 1)]
        lines.append(f"| {n} | {version} | " + " | ".join(cells) + " |")
    if common < 1:
        return [*lines, "", "some run never began step 1: no common step to compare"]
    by_version: dict[str, list[float]] = {}
    for version, starts in runs:
        by_version.setdefault(version, []).append(starts[common])
    first = statistics.median(by_version[runs[0][0]])
    lines += ["", f"seconds until step {common} began (the baseline and {common - 1} step(s) done):"]
    for version, values in by_version.items():
        median = statistics.median(values)
        lines.append(f"- {version}: median {median:.1f} s of {len(values)} runs "
                     f"({', '.join(f'{v:.1f}' for v in values)}); {median / first:.3f}x the {runs[0][0]} median")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python benchmarks/demo_ab_table.py OUT_FOLDER_OF_DEMO_AB", file=sys.stderr)
        return 2
    folders = sorted((p for p in Path(argv[0]).iterdir() if (p / "demo.txt").is_file()),
                     key=lambda p: int(p.name.split("-")[0]) if p.name.split("-")[0].isdigit() else 0)
    runs = [(version_of(p), step_starts((p / "demo.txt").read_text(errors="replace"))) for p in folders]
    print("\n".join(table(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
