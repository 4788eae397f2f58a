"""GPU check of matmul / attention and every prepared step, without touching the work tree.

Run from examples/kernels on a GPU machine:

    python -m tests.check_compute_bound_steps            # both ops, all steps
    python -m tests.check_compute_bound_steps matmul     # one op

For the current kernel module and each ``optimizations/<op>/NN-*.py`` (loaded from its file, in
the steps.yaml order) it checks correctness on tail shapes, then times the large shapes with the
suite's timing method (cutile_perf.bench) next to the PyTorch reference (cuBLAS / SDPA flash).
One line per (version, shape): median ms, TFLOP/s, % of the reference. A version that fails to
compile or gives a wrong answer prints the error and the next one runs. Not a pytest module.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import traceback
from pathlib import Path

import yaml

SUITE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SUITE / "src"))

from tests import common  # noqa: E402
from tests.common import torch  # noqa: E402
from tests.ops import test_attention as attn  # noqa: E402
from tests.ops import test_matmul as mm  # noqa: E402


def versions(op: str):
    """(label, path) of the current kernel module, then each prepared step in steps.yaml order."""
    steps = yaml.safe_load((SUITE / "optimizations" / op / "steps.yaml").read_text())
    yield "current", SUITE / steps["kernel_file"]
    for step in steps["steps"]:
        yield step["file"], SUITE / "optimizations" / op / step["file"]


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"check_{name}_{path.stem.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_ms(fn) -> float:
    from cutile_perf.bench import bench
    from cutile_perf.judge.stats import median

    return median(bench(fn))


def check_matmul(module) -> list[str]:
    for m, n, k, dtype in [(257, 129, 65, torch.bfloat16), (1000, 1000, 1000, torch.float16),
                           (1024, 1024, 1023, torch.bfloat16)]:
        a, b = mm.make_inputs(m, n, k, dtype, seed=1)
        common.assert_close(module.matmul(a, b), mm.reference(a, b), dtype)
    lines = []
    for m, n, k, dtype in mm.PERF_CASES:
        a, b = mm.make_inputs(m, n, k, dtype, seed=2)
        common.assert_close(module.matmul(a, b), mm.reference(a, b), dtype)
        ours, ref = median_ms(lambda: module.matmul(a, b)), median_ms(lambda: torch.matmul(a, b))
        lines.append(f"{mm.case_id(m, n, k, dtype):24s} {ours:8.3f} ms {mm.tflops(m, n, k, ours):7.1f} TFLOP/s "
                     f"{100 * ref / ours:6.1f} % of cuBLAS ({mm.tflops(m, n, k, ref):.1f})")
    return lines


def check_attention(module) -> list[str]:
    for shape, dtype, causal in [((2, 3, 100, 64), torch.bfloat16, True), ((1, 2, 257, 128), torch.float16, True),
                                 ((1, 2, 257, 128), torch.bfloat16, False), ((1, 1, 1, 64), torch.float16, True)]:
        q, k, v = attn.make_inputs(shape, dtype, seed=1)
        expected = attn.reference(q, k, v, causal, 1.0 / math.sqrt(shape[-1]))
        common.assert_close(module.fmha(q, k, v, causal=causal), expected, dtype)
    lines = []
    for shape, dtype, causal in attn.PERF_CASES:
        q, k, v = attn.make_inputs(shape, dtype, seed=2)
        expected = attn.reference(q, k, v, causal, 1.0 / math.sqrt(shape[-1]))
        common.assert_close(module.fmha(q, k, v, causal=causal), expected, dtype)
        ours = median_ms(lambda: module.fmha(q, k, v, causal=causal))
        ref = median_ms(lambda: attn.sdpa_flash(q, k, v, causal))
        lines.append(f"{attn.case_id(shape, dtype, causal):30s} {ours:8.3f} ms "
                     f"{attn.tflops(shape, causal, ours):7.1f} TFLOP/s {100 * ref / ours:6.1f} % of SDPA flash "
                     f"({attn.tflops(shape, causal, ref):.1f})")
    return lines


CHECKS = {"matmul": check_matmul, "attention": check_attention}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help=f"ops to check (default: {' '.join(CHECKS)})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.ops) - set(CHECKS))
    if unknown:
        parser.error(f"unknown op(s) {', '.join(unknown)}; expected some of {', '.join(CHECKS)}")
    failures = 0
    for op in args.ops or list(CHECKS):
        for label, path in versions(op):
            print(f"== {op} {label}", flush=True)
            try:
                for line in CHECKS[op](load(path, op)):
                    print("   " + line, flush=True)
            except Exception:  # a broken step is a result to report, not a reason to stop
                failures += 1
                print("   FAILED: " + traceback.format_exc(limit=3).strip().replace("\n", "\n   "), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
