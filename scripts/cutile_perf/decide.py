"""Keep, revert or re-measure one optimization: the loop's rules as pure functions.

The seed rules (TileGym's improve-perf skill), on the geometric mean of per-shape medians:

    improvement >= 5 %            keep, new baseline                     tier "new-baseline"
    improvement 2-5 %             keep, lower the next item's priority   tier "keep-lower-priority"
    improvement < 2 %             keep, recommend stopping               tier "keep-recommend-stop"
    any shape slower              revert                                 tier "regression"
    2 iterations without gain     stop                                   (stop_condition)
    more than 25 iterations       stop                                   (stop_condition)

Made noise-aware. The baseline is measured several times; ``noise_floor`` turns the spread of
those per-shape medians into a relative noise per shape. A change counts only beyond its *gate*,
``max(threshold, noise_k x noise)``; below it the change is noise (tier "no-change": the code is
kept, as the seed's "< 2 %" row says, but its numbers do not become the baseline, so noise cannot
ratchet the reference). A change just past the gate (within ``confirm_band x noise_k x noise``
beyond it) is *borderline*: the verdict is "confirm", and the harness re-measures baseline and
candidate interleaved in one run; ``confirm`` decides from those paired samples with a bootstrap
interval of the median ratio (``stats.ratio_ci``).

"Slower" for a shape means: its median rose by more than its gate. A shape that rose by less is
noise, however it looks. Changes are signed fractions: -0.06 is 6 % faster.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from cutile_perf import stats

VERDICTS = ("keep", "revert", "confirm")
# Tiers that moved performance: their numbers become the new baseline.
IMPROVING_TIERS = ("new-baseline", "keep-lower-priority", "keep-recommend-stop")
TIERS = (*IMPROVING_TIERS, "no-change", "regression", "missing-shape", "borderline")

DEFAULT_MIN_NOISE = 0.005
# Noise assumed for a shape measured once: one run says nothing about its spread.
SINGLE_RUN_NOISE = 0.02
MIN_CONFIRM_SAMPLES = 3


@dataclass(frozen=True)
class Thresholds:
    """Every number the rules use; stored in session.yaml so a session decides the same way throughout."""

    new_baseline: float = 0.05  # geomean improvement that makes a new baseline
    keep: float = 0.02  # a kept improvement below this recommends stopping
    regression_tolerance: float = 0.0  # a shape may be this much slower (beyond noise it never may)
    noise_k: float = 1.5  # gate = max(threshold, noise_k x noise floor)
    min_noise: float = DEFAULT_MIN_NOISE  # floor of any noise estimate
    confirm_band: float = 1.0  # borderline zone past the gate, in units of noise_k x noise
    confidence: float = 0.95  # of the paired-sample interval in confirm()
    patience: int = 2  # iterations in a row without improvement before stopping
    max_iterations: int = 25

    def __post_init__(self):
        for name in ("new_baseline", "keep", "regression_tolerance", "noise_k", "min_noise", "confirm_band"):
            if not (isinstance(getattr(self, name), (int, float)) and getattr(self, name) >= 0):
                raise ValueError(f"threshold {name}={getattr(self, name)!r} must be a number >= 0")
        if self.keep > self.new_baseline:
            raise ValueError(f"keep ({self.keep}) must not exceed new_baseline ({self.new_baseline})")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence} must be between 0.5 and 1")
        if self.patience < 1 or self.max_iterations < 1:
            raise ValueError("patience and max_iterations must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> Thresholds:
        data = dict(data or {})
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"unknown threshold(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
        return cls(**data)


@dataclass(frozen=True)
class Decision:
    verdict: str  # keep / revert / confirm
    tier: str  # see TIERS
    reason: str  # one line naming the deciding shape and its % change
    rebaseline: bool = False  # the candidate's numbers become the baseline
    changes: dict = field(default_factory=dict)  # shape -> signed relative change
    gates: dict = field(default_factory=dict)  # shape -> gate it had to clear
    geomean_change: float | None = None
    worst_shape: str | None = None  # the shape that slowed most (or sped up least)
    source: str = "single"  # "single": one candidate run; "confirm": interleaved paired samples

    def to_dict(self) -> dict:
        return asdict(self)


# --- measurements -------------------------------------------------------------------------------


def noise_floor(runs: dict[str, list[float]], *, minimum: float = DEFAULT_MIN_NOISE) -> dict[str, float]:
    """Relative noise per shape: the estimated width of the band that repeated runs of the same
    code land in, from the spread of their per-run medians.

    n runs drawn from a band of width W spread over (n - 1) / (n + 1) of it on average, so the
    width is estimated as ``relative_spread x (n + 1) / (n - 1)``: 3 x the spread for 2 runs,
    2 x for 3, 1.5 x for 5. Few runs thus give a wider, more careful floor. Never below
    ``minimum``; a shape measured once gets ``SINGLE_RUN_NOISE``.
    """
    own = {}
    for shape, values in runs.items():
        n = len(values)
        own[shape] = SINGLE_RUN_NOISE if n < 2 else stats.relative_spread(values) * (n + 1) / (n - 1)
    if not own:
        return {}
    # Run-to-run drift (clocks, heat, neighbours) hits every shape of a run alike, so a shape whose
    # few runs happened to agree is not trusted to be quieter than the typical shape of the kernel.
    typical = stats.median(list(own.values()))
    return {shape: max(minimum, value, typical) for shape, value in own.items()}


def combine_latency(medians: dict[str, float]) -> float:
    """The single latency of an iteration: geometric mean of per-shape medians (ms).

    Geometric, so that a 10 % gain on a 0.01 ms shape counts as much as one on a 5 ms shape.
    """
    if not medians:
        raise ValueError("combine_latency needs at least one shape")
    return stats.geomean(list(medians.values()))


def format_change(change: float) -> str:
    """A relative change as text: ``-0.031`` -> ``"-3.1 %"``."""
    return f"{change * 100:+.1f} %"


def _aggregate_noise(noise: dict[str, float], shapes: list[str], minimum: float) -> float:
    # Root mean square, not divided by sqrt(n): run-to-run drift (clocks, heat) moves all shapes together.
    return max(minimum, math.sqrt(sum(noise[s] ** 2 for s in shapes) / len(shapes)))


def decide(
    baseline: dict[str, float], candidate: dict[str, float], noise: dict[str, float], t: Thresholds
) -> Decision:
    """Verdict on one candidate run against the current baseline (per-shape medians, ms)."""
    missing = sorted(set(baseline) - set(candidate))
    if missing:
        return Decision("revert", "missing-shape", f"shape {missing[0]} has no record in the candidate run "
                        f"({len(missing)} of {len(baseline)} missing)", worst_shape=missing[0])
    shapes = sorted(baseline)
    changes = {s: stats.relative_change(baseline[s], candidate[s]) for s in shapes}
    floor = {s: max(t.min_noise, noise.get(s, SINGLE_RUN_NOISE)) for s in shapes}
    gates = {s: max(t.regression_tolerance, t.noise_k * floor[s]) for s in shapes}
    # The borderline band is as wide for every shape as for the noisiest one: a quiet shape's few
    # runs may have agreed by luck, so only a move beyond what any shape's noise explains skips
    # the interleaved confirmation.
    widest = max(floor.values())
    bands = {s: t.confirm_band * t.noise_k * widest for s in shapes}
    worst = max(shapes, key=lambda s: changes[s] - gates[s])
    agg = stats.geomean([candidate[s] / baseline[s] for s in shapes]) - 1.0
    agg_noise = _aggregate_noise(floor, shapes, t.min_noise)
    agg_gate, agg_band = t.noise_k * agg_noise, t.confirm_band * t.noise_k * widest
    made = dict(changes=changes, gates=gates, geomean_change=agg, worst_shape=worst)
    slower = f"shape {worst} {format_change(changes[worst])} vs baseline (gate {gates[worst] * 100:.1f} %)"

    if changes[worst] > gates[worst] + bands[worst]:
        return Decision("revert", "regression", f"{slower}: slower", **made)
    if changes[worst] > gates[worst]:
        return Decision("confirm", "borderline", f"{slower}: borderline slower, re-measure interleaved", **made)
    geo = f"geomean {format_change(agg)} (gate {agg_gate * 100:.1f} %); worst shape {worst} {format_change(changes[worst])}"
    if agg > agg_gate + agg_band:
        return Decision("revert", "regression", f"{geo}: slower overall", **made)
    if agg > agg_gate:
        return Decision("confirm", "borderline", f"{geo}: borderline slower overall, re-measure interleaved", **made)
    if -agg <= agg_gate:
        return Decision("keep", "no-change", f"{geo}: within noise, kept without moving the baseline", **made)
    if -agg <= agg_gate + agg_band:
        return Decision("confirm", "borderline", f"{geo}: borderline faster, re-measure interleaved", **made)
    tier = _improvement_tier(-agg, t)
    return Decision("keep", tier, f"{geo}: faster ({tier})", rebaseline=True, **made)


def _improvement_tier(improvement: float, t: Thresholds) -> str:
    if improvement >= t.new_baseline:
        return "new-baseline"
    if improvement >= t.keep:
        return "keep-lower-priority"
    return "keep-recommend-stop"


def confirm(paired: dict[str, tuple[list[float], list[float]]], t: Thresholds) -> Decision:
    """Final verdict from an interleaved re-measurement: ``{shape: (baseline_samples, candidate_samples)}``.

    Each sample is one run's median. A shape is slower when the whole ``t.confidence`` interval of
    median(candidate)/median(baseline) lies beyond its gate, ``max(tolerance, noise of the baseline
    samples)``: the interval already carries the statistics, the gate the practical size. An
    improvement needs the interval of the per-pair geomean ratio to lie below ``1 - gate``.
    """
    if not paired:
        raise ValueError("confirm needs at least one shape")
    for shape, (base, cand) in paired.items():
        if min(len(base), len(cand)) < MIN_CONFIRM_SAMPLES:
            raise ValueError(f"confirm needs >= {MIN_CONFIRM_SAMPLES} samples per side; shape {shape} has "
                             f"{len(base)} baseline and {len(cand)} candidate")
    shapes = sorted(paired)
    intervals = {s: stats.ratio_ci(*paired[s], confidence=t.confidence) for s in shapes}
    noise = noise_floor({s: paired[s][0] for s in shapes}, minimum=t.min_noise)
    gates = {s: max(t.regression_tolerance, noise[s]) for s in shapes}
    changes = {s: intervals[s][0] - 1.0 for s in shapes}
    worst = max(shapes, key=lambda s: intervals[s][1] - 1.0 - gates[s])
    base_agg, cand_agg = _per_pair_geomeans(paired, shapes)
    ratio, low, high = stats.ratio_ci(base_agg, cand_agg, confidence=t.confidence)
    agg_gate = max(t.min_noise, stats.relative_spread(base_agg))
    made = dict(changes=changes, gates=gates, geomean_change=ratio - 1.0, worst_shape=worst, source="confirm")
    ci = lambda lo, hi: f"[{format_change(lo - 1)}, {format_change(hi - 1)}]"  # noqa: E731

    if intervals[worst][1] - 1.0 > gates[worst]:
        return Decision("revert", "regression", f"shape {worst} {format_change(changes[worst])} slower, interval "
                        f"{ci(*intervals[worst][1:])} beyond gate {gates[worst] * 100:.1f} % (interleaved)", **made)
    geo = f"geomean {format_change(ratio - 1)}, interval {ci(low, high)}, gate {agg_gate * 100:.1f} % (interleaved)"
    if low - 1.0 > agg_gate:
        return Decision("revert", "regression", f"{geo}: slower overall", **made)
    if 1.0 - high > agg_gate:
        tier = _improvement_tier(1.0 - ratio, t)
        return Decision("keep", tier, f"{geo}: faster ({tier})", rebaseline=True, **made)
    return Decision("keep", "no-change", f"{geo}: within noise, kept without moving the baseline", **made)


def _per_pair_geomeans(paired, shapes) -> tuple[list[float], list[float]]:
    """Geomean over shapes of each interleaved round; rounds are aligned by position."""
    rounds = min(min(len(paired[s][0]), len(paired[s][1])) for s in shapes)
    base = [stats.geomean([paired[s][0][i] for s in shapes]) for i in range(rounds)]
    cand = [stats.geomean([paired[s][1][i] for s in shapes]) for i in range(rounds)]
    return base, cand


# --- the loop over iterations -------------------------------------------------------------------


def improved(entry: dict) -> bool:
    """Whether a log entry moved performance (a kept change in an improving tier)."""
    tier = (entry.get("decision") or {}).get("tier")
    return entry.get("status") == "keep" and tier in IMPROVING_TIERS


def stop_condition(history: list[dict], t: Thresholds) -> str | None:
    """One line saying why the loop should stop now, or None. ``history``: log entries, baseline first."""
    tries = [e for e in history if e.get("iteration", 0) > 0]
    if not tries:
        return None
    last = tries[-1]
    if last.get("iteration", 0) >= t.max_iterations:
        return f"stop: reached the limit of {t.max_iterations} iterations"
    recent = tries[-t.patience :]
    if len(recent) == t.patience and not any(improved(e) for e in recent):
        return f"stop: {t.patience} iterations in a row without improvement"
    decision = last.get("decision") or {}
    if last.get("status") == "keep" and decision.get("tier") in ("keep-recommend-stop", "no-change"):
        gain = -(decision.get("geomean_change") or 0.0)
        return (f"recommend stop: the last kept change gained {gain * 100:.1f} % (< {t.keep * 100:.0f} %); "
                "continue only if the user asks")
    return None


def next_priority_hint(history: list[dict]) -> str | None:
    """What the seed rules say about the next optimization to try, from the last iteration."""
    tries = [e for e in history if e.get("iteration", 0) > 0]
    if not tries:
        return None
    last = tries[-1]
    tier = (last.get("decision") or {}).get("tier")
    if last.get("status") == "crash":
        return f"iteration {last.get('iteration')} crashed ({last.get('crash_class') or 'unknown'}): fix or skip it"
    if last.get("status") == "revert":
        return "reverted: try the next optimization in priority order"
    if tier == "keep-lower-priority":
        return "gain of 2-5 %: move on to a lower-priority item of the same kind next"
    if tier == "new-baseline":
        return "gain of 5 % or more: keep exploring this direction"
    return None
