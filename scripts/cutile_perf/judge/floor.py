"""The physics floor of a checked timed call (pure): the bytes its tensors must move over the copy
bandwidth measured on that GPU (``child.copy_bandwidth.bandwidth``); a record below it is ``implausible``."""
from __future__ import annotations

# A record below (bytes that must move / measured bandwidth) divided by this is implausible: the copy
# benchmark reaches somewhat less than the memory's peak, and an op may skip part of an input it is
# handed (a baseline below the floor switches the floor off for its case, see ``floor_verdict``).
FLOOR_MARGIN = 2.0


def floor_ms(bytes_moved: int, gbps: float) -> float:
    return bytes_moved / (gbps * 1e9) * 1e3


def floor_verdict(case: str, candidate_ms: float, baseline_ms: float | None, bytes_moved: int,
                  gbps: float | None) -> str | None:
    """Why ``candidate_ms`` breaks physics for ``case``, or None (pure).

    The floor is ``bytes_moved / gbps`` over ``FLOOR_MARGIN``. It applies only where the baseline's
    own median respects it: a baseline below it means the op moves less than its tensors' bytes
    (it skips part of an input), so bytes are no floor for that case."""
    if not gbps or gbps <= 0 or bytes_moved <= 0:
        return None
    floor = floor_ms(bytes_moved, gbps) / FLOOR_MARGIN
    if baseline_ms is not None and baseline_ms < floor:
        return None
    if candidate_ms < floor:
        return (f"case {case} recorded {candidate_ms:.4g} ms, below its floor of {floor:.4g} ms ({bytes_moved} bytes "
                f"at {gbps:.0f} GB/s measured, over a margin of {FLOOR_MARGIN:g})")
    return None
