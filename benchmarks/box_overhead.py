"""What the children's sandbox costs per child: ``python -c pass`` and a CUDA start-up (``import torch``, ``torch.cuda.init()``),
unboxed and in the box (``child/box.py``: the closed box, private /dev and IPC included), interleaved, medians.

    PYTHONPATH=scripts python benchmarks/box_overhead.py [--runs 20]

Prints one line per command with both medians and the difference (the added wall time per child).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.child import box


def startup_cost(code: str = "pass", runs: int = 20) -> tuple[float, float]:
    """Median wall seconds of ``python -c <code>`` unboxed and in a box (``runs`` each, interleaved):
    what the box adds to every child (also ``tests/test_box.py``)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkout, private = root / "checkout", root / "private"
        checkout.mkdir()
        private.mkdir()
        b = box.for_stage(root / "repo", checkout, private, None)
        plain: list[float] = []
        boxed: list[float] = []
        for _ in range(runs):
            for argv, env, out in (([sys.executable, "-c", code], knobs.child_env(), plain),
                                   (b.wrap([sys.executable, "-c", code], checkout), b.env(knobs.allowed_child_env()),
                                    boxed)):
                start = time.perf_counter()
                subprocess.run(argv, env=env, cwd=checkout, check=True)
                out.append(time.perf_counter() - start)
        return statistics.median(plain), statistics.median(boxed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    why_not = box.available()
    print(f"box: {box.label(why_not)}")
    if why_not is not None:
        return 1
    for code in ("pass", "import torch; torch.cuda.is_available() and torch.cuda.init()"):
        plain, boxed = startup_cost(code, args.runs)
        print(f"python -c {code!r}: unboxed {plain * 1e3:.1f} ms, boxed {boxed * 1e3:.1f} ms, "
              f"added {(boxed - plain) * 1e3:.1f} ms (medians of {args.runs}, interleaved)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
