"""Leave no correct result in freed memory before the checked call after a timer.

A change that skips its work and returns ``torch.empty`` of the result's shape gets whatever block
the caching allocator hands out, and after a timer's calls every cached block of that size holds an
earlier call's correct result: the skipped call then passes a comparison. Before the call after the
timer, ``poison`` takes every cached free block that could serve a result's size, fills it with NaN
(the dtype's maximum for integers, ``True`` for bool) and frees it again, so a call that skips its
work returns NaN.

One block per result was not enough (another cached block still held a correct result: the swiglu
cheat in ``docs/design.md``, "Checked timed calls"): blocks are taken until the allocator reserves
new memory (then no cached block of that size was left) or ``MAX_BLOCKS`` per result; the memory
this costs is cached already, plus one new segment at most. On a CPU (no caching allocator) one
block is filled.
"""
from __future__ import annotations

MAX_BLOCKS = 1 << 14


def fill_value(torch, t):
    if t.is_floating_point() or t.is_complex():
        return float("nan")
    return True if t.dtype == torch.bool else torch.iinfo(t.dtype).max


def poison(torch, like) -> int:
    """Fill, then free, the cached blocks that could serve each tensor of ``like``; returns how many."""
    filled = []
    for t in like:
        cuda, value = t.device.type == "cuda", fill_value(torch, t)
        for _ in range(MAX_BLOCKS if cuda else 1):
            reserved = torch.cuda.memory_reserved(t.device) if cuda else 0
            try:
                filled.append(torch.full(t.shape, value, dtype=t.dtype, device=t.device))
            except torch.cuda.OutOfMemoryError:
                break  # no cached block was left for it either
            if cuda and torch.cuda.memory_reserved(t.device) > reserved:
                break  # this one came from new memory: every cached block of this size is filled
    count = len(filled)
    del filled
    return count
