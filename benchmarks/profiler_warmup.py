"""Which part of a process's first ``torch.profiler`` session can be paid without a CUDA context.

    python benchmarks/profiler_warmup.py

A perf child's first device-time witness costs about 4 s (``benchmarks/child_phases.py``): the
profiler's one-off set-up. A child started ahead of its turn (``child.warmstart``) may not make a
CUDA context while it waits, so it cannot run ``bench.warm_up_profiler``. Each variant below runs in
a fresh process: a warm-up step that makes no CUDA context (checked: ``torch.cuda.is_initialized``
and whether ``nvidia-smi`` lists the process), then a CUDA context and one profiled kernel, the
step a witness pays. Prints one table; needs a GPU.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

CHILD = r'''
import json, os, subprocess, sys, time
variant = sys.argv[1]
t0 = time.perf_counter()
import torch
from torch import profiler
t_import = time.perf_counter()
if variant == "cpu-session":
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as p:
        torch.ones(4).add_(1)
    p.events()
elif variant == "cuda-session-no-context":
    with profiler.profile(activities=[profiler.ProfilerActivity.CUDA]) as p:
        pass
    p.events()
elif variant == "supported-activities":
    profiler.supported_activities()
elif variant == "load-cupti":
    import ctypes, glob
    found = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcupti.so*")))
    found += sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu13", "lib", "libcupti.so*")))
    if found:
        ctypes.CDLL(found[0])
t_warm = time.perf_counter()
cuda_before = torch.cuda.is_initialized()
try:
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split()
    listed = str(os.getpid()) in apps
except OSError:
    listed = False
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t_ctx = time.perf_counter()
with profiler.profile(activities=[profiler.ProfilerActivity.CUDA]) as p:
    x.add_(1); torch.cuda.synchronize()
events = p.events()
t_first = time.perf_counter()
# The warm-up must not cost the profile its point: the kernel it ran must still be seen.
kernels = sum(1 for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
with profiler.profile(activities=[profiler.ProfilerActivity.CUDA]) as p:
    x.add_(1); torch.cuda.synchronize()
p.events()
t_second = time.perf_counter()
print("RESULT " + json.dumps({"import": t_import - t0, "warm-up step": t_warm - t_import,
                              "context during warm-up": cuda_before or listed,
                              "CUDA context": t_ctx - t_warm, "first CUDA profile": t_first - t_ctx,
                              "second CUDA profile": t_second - t_first, "kernels seen": kernels}))
'''

VARIANTS = ["none", "cpu-session", "supported-activities", "load-cupti", "cuda-session-no-context"]


def main() -> int:
    rows = []
    for variant in VARIANTS:
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, variant], capture_output=True, text=True, timeout=120)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            rows.append((variant, {"error": (out.stderr.strip().splitlines() or ["no output"])[-1][:120]}))
            continue
        rows.append((variant, {**json.loads(line[7:]), "wall": time.perf_counter() - start}))
    keys = ["import", "warm-up step", "context during warm-up", "CUDA context", "first CUDA profile",
            "second CUDA profile", "kernels seen", "wall"]
    print("| variant | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for variant, r in rows:
        if "error" in r:
            print(f"| {variant} | error: {r['error']} |")
            continue
        cells = [str(r[k]) if isinstance(r[k], (bool, int)) else f"{r[k]:.2f} s" for k in keys]
        print(f"| {variant} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
