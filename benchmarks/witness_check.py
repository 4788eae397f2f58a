"""The device-time witness against honest timings: one table, every bench mode, several op kinds.

    PYTHONPATH=scripts python benchmarks/witness_check.py [--markdown]

For each op (a copy, cuBLAS GEMMs, eager multi-kernel ops whose launches leave host gaps, a tiny
kernel) and each bench mode, `bench_record` gives the samples' median (events, or CUPTI kernel time in
the cupti modes) and the witness's `device_ms`;
the ratio median / device_ms is what `judge.rules.witness_shortfall` compares with WITNESS_FLOOR
(an honest record must stay above it, with room). Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import sys

from cutile_perf import bench
from cutile_perf.judge import rules


def ops(torch):
    big = torch.empty(64 * 2**20, dtype=torch.float16, device="cuda")
    out = torch.empty_like(big)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(3072, 2720, device="cuda", dtype=torch.bfloat16)
    d = torch.randn(2720, 6144, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(262144, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, device="cuda", dtype=torch.float16)
    small = torch.randn(64, 1024, device="cuda")

    def rms_eager():  # ~5 kernels with Python between them
        var = x.float().pow(2).mean(-1, keepdim=True)
        return w * (x.float() * torch.rsqrt(var + 1e-6)).to(x.dtype)

    return {
        "copy 128 MB": lambda: out.copy_(big),
        "cuBLAS 4096^3 bf16": lambda: a @ b,
        "cuBLAS 3072x6144x2720 bf16": lambda: c @ d,
        "eager RMSNorm 262144x1024 (5 kernels)": rms_eager,
        "softmax 64x1024 fp32 (tiny)": lambda: torch.softmax(small, -1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true")
    parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for name, fn in ops(torch).items():
        for mode in bench.MODES:
            rec = bench.bench_record(fn, mode=mode, max_reps=200, check_escape=False)
            device = rec.get("device_ms")
            ratio = rec["median"] / device if device else float("nan")
            flagged = rules.witness_shortfall(rec["median"], device) is not None
            rows.append((name, mode, rec["median"], device, ratio, flagged))
    print(f"| op | mode | median ms | witness ms | ratio | flagged (floor {rules.WITNESS_FLOOR}) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, mode, median, device, ratio, flagged in rows:
        shown = f"{device:.4f}" if device else "none"
        print(f"| {name} | {mode} | {median:.4f} | {shown} | {ratio:.3f} | {'YES' if flagged else 'no'} |")
    ratios = sorted(r[4] for r in rows if r[3])
    if ratios:
        print(f"\nratio min {ratios[0]:.3f}, median {ratios[len(ratios) // 2]:.3f}, max {ratios[-1]:.3f}")
    return 1 if any(r[5] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
