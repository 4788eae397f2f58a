"""What the children's sandbox costs per child: ``python -c pass`` and a CUDA start-up (``import torch``, ``torch.cuda.init()``),
unboxed and in the box (``child/box.py``: the closed box, private /dev and IPC included), interleaved, medians.

    PYTHONPATH=scripts python benchmarks/box_overhead.py [--runs 20]

Prints one line per command with both medians and the difference (the added wall time per child).
"""
from __future__ import annotations

import argparse
import sys

from cutile_perf.child import box


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    why_not = box.available()
    print(f"box: {box.label(why_not)}")
    if why_not is not None:
        return 1
    for code in ("pass", "import torch; torch.cuda.is_available() and torch.cuda.init()"):
        plain, boxed = box.startup_cost(code, args.runs)
        print(f"python -c {code!r}: unboxed {plain * 1e3:.1f} ms, boxed {boxed * 1e3:.1f} ms, "
              f"added {(boxed - plain) * 1e3:.1f} ms (medians of {args.runs}, interleaved)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
