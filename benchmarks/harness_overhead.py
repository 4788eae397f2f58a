"""The harness's own time per iteration, pytest children excluded (goal: < 0.5 s).

Builds the simulated TileGym-shaped repository of the test suite in a temporary directory, runs
``init``, ``baseline`` and a few ``try`` iterations through the real CLI, and prints the
``harness_s`` that each log entry records (wall time of the command minus its pytest children).

    python benchmarks/harness_overhead.py [--iterations 6]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the simulated repository builder lives with the tests

from fixtures_repo import build_tilegym_like_repo, edit_kernel  # noqa: E402

from cutile_perf import stats  # noqa: E402
from cutile_perf.cli import main  # noqa: E402

GOAL_S = 0.5


def _cli(*argv: str) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(list(argv))


def run(iterations: int) -> tuple[list[dict], list[float]]:
    """Log entries, and the wall time of each ``try`` process (interpreter start-up included)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "scripts"), os.environ.get("PYTHONPATH", "")])}
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_tilegym_like_repo(Path(tmp))
        r = str(repo)
        assert _cli("init", "--repo", r, "--kernel", "rms_norm") == 0
        assert _cli("baseline", "--repo", r, "--repeats", "1") == 0
        for i in range(iterations):
            # Alternate a faster (kept) and a much slower (reverted) candidate: both paths are timed.
            scale = 0.9 ** (i // 2 + 1) if i % 2 == 0 else 3.0
            edit_kernel(repo, latency={"256x1024": round(1.0 * scale, 6), "4096x1024": round(2.0 * scale, 6)})
            start = time.monotonic()
            subprocess.run([sys.executable, "-m", "cutile_perf", "try", "--repo", r, f"step {i}"], env=env,
                           capture_output=True, check=False)
            walls.append(time.monotonic() - start)
        lines = (repo / "sandbox/experiments.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line], walls


def main_cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6)
    args = parser.parse_args()
    entries, walls = run(args.iterations)
    tries = [e for e in entries if e["iteration"] > 0]
    # harness_s (logged): command start to log write. process_s: the whole `try` process, interpreter
    # start-up, final reset and table rendering included, minus the pytest children.
    print(f"{'iteration':>9}  {'status':<7} {'harness_s':>9} {'process_s':>9} {'children_s':>10}")
    for e, wall in zip(tries, walls):
        t = e["timings"]
        print(f"{e['iteration']:>9}  {e['status']:<7} {t['harness_s']:>9.3f} {wall - t['children_s']:>9.3f} "
              f"{t['children_s']:>10.3f}")
    med = stats.median([wall - e["timings"]["children_s"] for e, wall in zip(tries, walls)])
    verdict = "meets" if med < GOAL_S else "MISSES"
    print(f"median harness time per try, whole process minus pytest children: {med:.3f} s "
          f"({verdict} the {GOAL_S} s goal); simulated repository, CPU only")
    return 0 if med < GOAL_S else 1


if __name__ == "__main__":
    raise SystemExit(main_cli())
