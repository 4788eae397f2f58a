"""The device's copy bandwidth by timing mode: the floor of checked timed calls (``judge.floor``).

Measured once per reference child (``checked._replay``), where no candidate code has run.
"""
from __future__ import annotations

import time


def bandwidth(torch) -> dict:
    """Copy bandwidth in GB/s by timing mode: ``flushed`` (a copy far larger than L2: DRAM/HBM) and
    ``not flushed`` (a copy that fits in L2, repeated). On a CPU (no CUDA): host memory for both,
    the simulated device of the CPU tests."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        return {"flushed": _copy_gbps(torch, 8 * l2, "cuda", 5), "not flushed": _copy_gbps(torch, l2 // 4, "cuda", 50),
                "device": props.name}
    big = _copy_gbps(torch, 64 * 2**20, "cpu", 3)
    return {"flushed": big, "not flushed": big, "device": "cpu (simulated device)"}


def _copy_gbps(torch, nbytes: int, device: str, repeats: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    best = float("inf")
    for _ in range(3):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            began = time.perf_counter()
            for _ in range(repeats):
                dst.copy_(src)
            seconds = time.perf_counter() - began
        best = min(best, seconds / repeats)
    return 2 * nbytes / best / 1e9  # read and write
