"""Pure ranking, pruning and A/B rules over tuning results (tested with scripted numbers)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cutile_perf.judge import stats
from cutile_perf.tune.config import Config, Trial

Results = Mapping[str, Sequence[Trial]]  # shape label -> trials of that shape


def slowdowns(results: Results) -> dict[Config, dict[str, float]]:
    """config -> shape -> score / best score of that shape (1.0 = the winner; inf = failed)."""
    table: dict[Config, dict[str, float]] = {}
    for shape, trials in results.items():
        ok = [t.score for t in trials if t.ok]
        best = min(ok) if ok else float("inf")
        for t in trials:
            table.setdefault(t.config, {})[shape] = t.score / best if t.ok and best > 0 else float("inf")
    return table


@dataclass(frozen=True)
class Ranked:
    config: Config
    geomean: float  # geometric mean slowdown vs the per-shape best over the shapes it ran on
    wins: int
    per_shape: dict[str, float]


def rank(results: Results) -> list[Ranked]:
    rows = []
    for cfg, per in slowdowns(results).items():
        finite = [v for v in per.values() if v != float("inf")]
        geo = stats.geomean(finite) if finite and len(finite) == len(per) else float("inf")
        rows.append(Ranked(cfg, geo, sum(1 for v in per.values() if v == 1.0), per))
    return sorted(rows, key=lambda r: (r.geomean, -r.wins, r.config.label()))


def keep_set(results: Results, *, tolerance: float = 0.05, max_keep: int = 8, must_keep: Sequence[Config] = ()) -> list[Config]:
    """A small set that stays within ``tolerance`` of the best on every shape, greedily.

    Start with ``must_keep`` (the fixed config); add the config that brings the most
    not-yet-covered shapes within tolerance (ties: better geomean), until every shape is covered
    or ``max_keep`` is reached. It stops as soon as every shape is covered: each extra config costs
    a compile on every new shape and wins nothing measurable.
    """
    table = slowdowns(results)
    ranked = {r.config: r for r in rank(results)}
    shapes = list(results)
    keep = [c for c in must_keep if c in table]

    def covered(cfgs):
        return {s for s in shapes for c in cfgs if table[c].get(s, float("inf")) <= 1.0 + tolerance}

    while len(keep) < max_keep and covered(keep) != set(shapes):
        missing = set(shapes) - covered(keep)
        best = max((c for c in table if c not in keep),
                   key=lambda c: (len(covered([c]) & missing), -ranked[c].geomean), default=None)
        if best is None or not covered([best]) & missing:
            break
        keep.append(best)
    return keep


def prune(results: Results, *, tolerance: float = 0.05, max_keep: int = 8, must_keep: Sequence[Config] = ()):
    """(kept, dropped): dropped configs never come within ``tolerance`` of the best on any shape,
    or are redundant once the kept set covers every shape."""
    keep = keep_set(results, tolerance=tolerance, max_keep=max_keep, must_keep=must_keep)
    table = slowdowns(results)
    dropped = []
    for cfg, per in table.items():
        if cfg in keep:
            continue
        near = min(per.values())
        why = ("never within {:.0%} of the best".format(tolerance) if near > 1.0 + tolerance
               else "covered by the kept configs")
        dropped.append((cfg, near, why))
    return keep, sorted(dropped, key=lambda d: d[1])


@dataclass(frozen=True)
class ABRow:
    shape: str
    tuned: Config
    fixed: Config
    tuned_ms: float
    fixed_ms: float
    ratio: float  # tuned / fixed median; < 1: tuning is faster
    low: float
    high: float

    def to_json(self) -> dict:
        return {"shape": self.shape, "tuned": self.tuned.to_json(), "fixed": self.fixed.to_json(),
                "tuned_ms": self.tuned_ms, "fixed_ms": self.fixed_ms, "ratio": self.ratio, "ci": [self.low, self.high]}

    @classmethod
    def from_json(cls, data: dict) -> ABRow:
        return cls(data["shape"], Config(data["tuned"]), Config(data["fixed"]), data["tuned_ms"], data["fixed_ms"],
                   data["ratio"], *data["ci"])

    @property
    def verdict(self) -> str:
        if self.high < 1.0:
            return "faster"
        if self.low > 1.0:
            return "slower"
        return "same (within noise)"


def ab_row(shape: str, tuned: Config, fixed: Config, tuned_times: Sequence[float], fixed_times: Sequence[float]) -> ABRow:
    ratio, low, high = stats.ratio_ci(fixed_times, tuned_times)
    return ABRow(shape, tuned, fixed, stats.median(tuned_times), stats.median(fixed_times), ratio, low, high)
