"""Pure statistics over plain lists of timings (milliseconds unless a name says otherwise).

Nothing here touches a GPU, a file or the clock, so every function is tested with plain lists.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence


def _require(values: Sequence[float], what: str) -> list[float]:
    data = [float(v) for v in values]
    if not data:
        raise ValueError(f"{what} needs at least one value")
    return data


def mean(values: Sequence[float]) -> float:
    data = _require(values, "mean")
    return math.fsum(data) / len(data)


def median(values: Sequence[float]) -> float:
    data = sorted(_require(values, "median"))
    mid = len(data) // 2
    return data[mid] if len(data) % 2 else (data[mid - 1] + data[mid]) / 2.0


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), ``0 <= q <= 1``."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q={q} outside [0, 1]")
    data = sorted(_require(values, "quantile"))
    pos = q * (len(data) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def std(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0.0 for a single value."""
    data = _require(values, "std")
    if len(data) < 2:
        return 0.0
    m = mean(data)
    return math.sqrt(math.fsum((v - m) ** 2 for v in data) / (len(data) - 1))


def rel_std_percent(values: Sequence[float]) -> float:
    """Standard deviation as a percentage of the mean (TileGym's ``rel_std``)."""
    m = mean(values)
    return 100.0 * std(values) / m if m else 0.0


def geomean(values: Sequence[float]) -> float:
    data = _require(values, "geomean")
    if any(v <= 0 for v in data):
        raise ValueError("geomean needs positive values")
    return math.exp(math.fsum(math.log(v) for v in data) / len(data))


def summarize(samples_ms: Sequence[float], *, peak_mem_mb: float | None = None) -> dict[str, float]:
    """The TileGym benchmark record for one set of samples: mean, std, rel_std (%), median, min, max, nrep."""
    data = _require(samples_ms, "summarize")
    record: dict[str, float] = {
        "mean": mean(data),
        "std": std(data),
        "rel_std": rel_std_percent(data),
        "median": median(data),
        "min": min(data),
        "max": max(data),
        "nrep": len(data),
    }
    if peak_mem_mb is not None:
        record["peak_mem_mb"] = peak_mem_mb
    return record


def relative_change(old: float, new: float) -> float:
    """Signed fractional change from ``old`` to ``new``: -0.10 means 10 % lower (faster)."""
    if old <= 0:
        raise ValueError("relative_change needs a positive reference value")
    return (new - old) / old


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far apart repeated measurements of the same thing landed."""
    data = _require(values, "relative_spread")
    mid = median(data)
    return (max(data) - min(data)) / mid if mid else 0.0


def ratio_ci(
    reference: Sequence[float],
    candidate: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Bootstrap interval of median(candidate) / median(reference).

    Returns ``(ratio, low, high)``; a ratio below 1 means the candidate is faster. The seed is
    fixed so the same samples always give the same verdict.
    """
    ref = _require(reference, "ratio_ci reference")
    cand = _require(candidate, "ratio_ci candidate")
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        r = median([rng.choice(ref) for _ in ref])
        c = median([rng.choice(cand) for _ in cand])
        ratios.append(c / r)
    alpha = (1.0 - confidence) / 2.0
    return median(cand) / median(ref), quantile(ratios, alpha), quantile(ratios, 1.0 - alpha)
