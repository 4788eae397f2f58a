"""The loop's rules as pure functions: thresholds, the single-run decision, tiers and when to stop.

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
candidate interleaved in one run; ``paired.confirm`` decides from those paired samples.

"Slower" for a shape means: its median rose by more than its gate. A shape that rose by less is
noise, however it looks. Changes are signed fractions: -0.06 is 6 % faster.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields

from cutile_perf.judge import stats
from cutile_perf.templating import format_change

# Tiers that moved performance: their numbers become the new baseline.
IMPROVING_TIERS = ("new-baseline", "keep-lower-priority", "keep-recommend-stop")
# "baseline-drift": the interleaved re-check's baseline runs kept disagreeing with the baseline's
# recorded medians (``baseline_disagreement``), so no keep could rest on them.
# "unstable": the candidate's own runs disagreed beyond the baseline's noise (``recheck.unstable``).
TIERS = (*IMPROVING_TIERS, "no-change", "regression", "missing-shape", "borderline", "baseline-drift", "unstable")

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
    # A claim of more than this factor on any case in one step is re-measured interleaved in fresh
    # processes before it can be kept, and marked for review.
    plausible_factor: float = 3.0
    # No GPU kernel launch measured with CUDA events takes less (event resolution is ~0.5 us): a
    # smaller median is a forged or broken record, not a fast kernel.
    min_plausible_ms: float = 1e-4
    # The interleaved re-check: at least this many (baseline, candidate) pairs, then one more pair at
    # a time while the verdict is ambiguous, up to max_confirm_pairs.
    min_confirm_pairs: int = 3
    max_confirm_pairs: int = 3
    # A single run whose worst case is slower by more than this fraction of its gate is re-measured
    # interleaved instead of being kept as "within noise": a real slowdown just under the gate must
    # not slip through, nor several of them add up (issue 9's ratchet).
    recheck_fraction: float = 0.25
    # The interleaved slowdown test: mean per-pair log ratio over its standard error (see confirm).
    slower_z: float = 2.75
    # The re-check stops before min_confirm_pairs once the pairs still to come could not change its
    # verdict anywhere within this many per-pair standard deviations of each case's pairs so far
    # (``paired.completed``, ``recheck.settled_early``). 0: always run min_confirm_pairs.
    settle_sd: float = 3.0

    def __post_init__(self):
        for name in ("new_baseline", "keep", "regression_tolerance", "noise_k", "min_noise", "confirm_band",
                     "min_plausible_ms", "recheck_fraction", "slower_z", "settle_sd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"threshold {name}={value!r} must be a finite number >= 0")
        if not (isinstance(self.plausible_factor, (int, float)) and math.isfinite(self.plausible_factor)
                and self.plausible_factor > 1):
            raise ValueError(f"plausible_factor={self.plausible_factor!r} must be a finite number > 1")
        if not (isinstance(self.min_confirm_pairs, int) and isinstance(self.max_confirm_pairs, int)
                and MIN_CONFIRM_SAMPLES <= self.min_confirm_pairs <= self.max_confirm_pairs):
            raise ValueError(f"confirm pairs must satisfy {MIN_CONFIRM_SAMPLES} <= min_confirm_pairs "
                             f"({self.min_confirm_pairs!r}) <= max_confirm_pairs ({self.max_confirm_pairs!r})")
        if self.keep > self.new_baseline:
            raise ValueError(f"keep ({self.keep}) must not exceed new_baseline ({self.new_baseline})")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence} must be between 0.5 and 1")
        if not (isinstance(self.patience, int) and isinstance(self.max_iterations, int)
                and self.patience >= 1 and self.max_iterations >= 1):
            raise ValueError("patience and max_iterations must be integers >= 1")

    def to_dict(self) -> dict:
        return asdict(self)

    def changed(self) -> list[tuple[str, object, object]]:
        """``(name, value, default)`` of each threshold set away from its default. They may be
        edited until the baseline, and an agent short of GPU time has reasons to loosen one (the
        plausibility re-check costs interleaved pairs), so status and the report name them."""
        defaults = asdict(Thresholds())
        return [(name, value, defaults[name]) for name, value in asdict(self).items() if value != defaults[name]]

    @classmethod
    def from_dict(cls, data: dict | None) -> Thresholds:
        if data is not None and not isinstance(data, dict):
            raise ValueError(f"expected a mapping of threshold names to numbers, not {data!r}")
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
    # "single": one candidate run; "confirm": interleaved paired samples of every case; "partial":
    # paired samples of the cases in doubt, the single run for the others
    source: str = "single"
    paired_z: dict = field(default_factory=dict)  # shape -> z of its paired slowdown test (confirm only)
    # source "partial": the cases the interleaved re-check re-measured (``cases_in_doubt``); the
    # others' changes and gates are the single run's.
    rechecked: list = field(default_factory=list)
    # The re-check stopped after this many pairs, short of min_confirm_pairs: the pairs still to come
    # could not have changed the verdict (``recheck.settled_early``). None: it ran them all.
    settled_after: int | None = None

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


def _aggregate_noise(noise: dict[str, float], shapes: list[str], minimum: float) -> float:
    # Root mean square, not divided by sqrt(n): run-to-run drift (clocks, heat) moves all shapes together.
    return max(minimum, math.sqrt(sum(noise[s] ** 2 for s in shapes) / len(shapes)))


def case_noise(noise: dict[str, float], case: str, t: Thresholds) -> float:
    """A case's noise floor as the rules read it: never below ``min_noise``; unmeasured, ``SINGLE_RUN_NOISE``."""
    return max(t.min_noise, noise.get(case, SINGLE_RUN_NOISE))


def single_run_gate(floor: float, t: Thresholds) -> float:
    """How much slower than the baseline a case may measure and still be noise: ``max(tolerance, noise_k x floor)``."""
    return max(t.regression_tolerance, t.noise_k * floor)


def recheck_bound(gate: float, t: Thresholds) -> float:
    """How far a case may rise in a single run and still pass it outright: ``max(tolerance,
    recheck_fraction x gate)``. A rise beyond it, still inside the gate, sends the case to the
    interleaved re-check: a real slowdown just under the gate must not slip through (issue 9)."""
    return max(t.regression_tolerance, t.recheck_fraction * gate)


GEOMEAN_ZONES = ("slower", "borderline-slower", "no-change", "borderline-faster", "faster")


def geomean_zone(ratios: dict[str, float], noise: dict[str, float], t: Thresholds) -> tuple[str, float, float]:
    """``(zone, change, gate)`` of a run's geomean (``ratios``: case -> candidate / baseline), one of
    ``GEOMEAN_ZONES``: beyond its gate and the borderline band either way ("slower", "faster"),
    inside the band ("borderline-..."), or within the gate ("no-change"). The single-run rule
    (``decide``) and the partial re-check (``verdict.judge``) place a geomean with it alike.

    The gate is ``noise_k`` x the cases' root mean square noise (not divided by sqrt(n): run-to-run
    drift moves every case together); the band is as wide as the noisiest case's."""
    shapes = sorted(ratios)
    floor = {s: case_noise(noise, s, t) for s in shapes}
    agg = stats.geomean([ratios[s] for s in shapes]) - 1.0
    gate = t.noise_k * _aggregate_noise(floor, shapes, t.min_noise)
    band = t.confirm_band * t.noise_k * max(floor.values())
    if agg > gate + band:
        zone = "slower"
    elif agg > gate:
        zone = "borderline-slower"
    elif -agg <= gate:
        zone = "no-change"
    elif -agg <= gate + band:
        zone = "borderline-faster"
    else:
        zone = "faster"
    return zone, agg, gate


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
    floor = {s: case_noise(noise, s, t) for s in shapes}
    gates = {s: single_run_gate(floor[s], t) for s in shapes}
    # The borderline band is as wide for every shape as for the noisiest one: a quiet shape's few
    # runs may have agreed by luck, so only a move beyond what any shape's noise explains skips
    # the interleaved confirmation.
    widest = max(floor.values())
    bands = {s: t.confirm_band * t.noise_k * widest for s in shapes}
    worst = max(shapes, key=lambda s: changes[s] - gates[s])
    zone, agg, agg_gate = geomean_zone({s: candidate[s] / baseline[s] for s in shapes}, noise, t)
    made = dict(changes=changes, gates=gates, geomean_change=agg, worst_shape=worst)
    slower = f"shape {worst} {format_change(changes[worst])} vs baseline (gate {gates[worst] * 100:.1f} %)"

    if changes[worst] > gates[worst] + bands[worst]:
        return Decision("revert", "regression", f"{slower}: slower", **made)
    if changes[worst] > gates[worst]:
        return Decision("confirm", "borderline", f"{slower}: borderline slower, re-measure interleaved", **made)
    # Every case is checked, not only the one nearest its gate: a quiet case's small rise can sit
    # nearer its gate than a noisy case's larger one, which would then go unchecked.
    unclear = [s for s in shapes if changes[s] > recheck_bound(gates[s], t)]
    if unclear:
        risen = max(unclear, key=lambda s: changes[s] / gates[s])
        return Decision("confirm", "borderline", f"shape {risen} {format_change(changes[risen])} vs baseline (gate "
                        f"{gates[risen] * 100:.1f} %): within noise but not clearly, re-measure interleaved", **made)
    geo = f"geomean {format_change(agg)} (gate {agg_gate * 100:.1f} %); worst shape {worst} {format_change(changes[worst])}"
    if zone == "slower":
        return Decision("revert", "regression", f"{geo}: slower overall", **made)
    if zone == "borderline-slower":
        return Decision("confirm", "borderline", f"{geo}: borderline slower overall, re-measure interleaved", **made)
    if zone == "no-change":
        return Decision("keep", "no-change", f"{geo}: within noise, kept without moving the baseline", **made)
    if zone == "borderline-faster":
        return Decision("confirm", "borderline", f"{geo}: borderline faster, re-measure interleaved", **made)
    tier = improvement_tier(-agg, t)
    return Decision("keep", tier, f"{geo}: faster ({tier})", rebaseline=True, **made)


def cases_in_doubt(baseline: dict[str, float], candidate: dict[str, float], noise: dict[str, float], t: Thresholds,
                   implausible: Iterable[str] = ()) -> tuple[str, ...]:
    """The cases the interleaved re-check re-measures after a single run that could not decide
    alone (``decide`` said "confirm", or a keep claims more than ``plausible_factor``); the other
    cases keep their single-run evidence.

    In doubt: every case that rose past ``recheck_bound`` (the borderline-slower ones among them)
    and every case ``implausible`` names. Every case, when the doubt is the geomean's: its zone is
    borderline or slower (a geomean rests on all cases), or nothing else is in doubt.

    Why the verdict stays valid (``verdict.judge`` combines the two kinds of case):

    * A case not in doubt rose by at most ``recheck_bound``: it passes the single run's per-case
      rule outright, the rule under which a run without such a rise is kept with no re-check at
      all. It is decided as a single-run keep decides every case; re-measuring it would give it a
      test that no single-run keep gets.
    * A case in doubt gets the interleaved test the whole re-check gives it. The pairs are fresh
      runs, independent of the run that chose the case (that run is never a sample), so choosing
      on it biases nothing in them; the slowdown test's Bonferroni count is the number of cases
      re-measured, the number of tests made, so an unchanged kernel's chance of a false revert per
      re-check stays ``slower_z``'s.
    * The geomean is judged again over every case, each re-measured case at its paired median
      ratio, by the single run's zones (``geomean_zone``). A zone outside the borderline band is
      decided as a single run decides it; the re-measured cases only replaced their first-run
      ratios with better-measured ones. A zone inside the band puts the geomean in doubt, so the
      re-check goes on with every other case and the whole re-check's verdict is final.
    """
    shapes = sorted(baseline)
    if set(shapes) - set(candidate):
        return tuple(shapes)
    gates = {s: single_run_gate(case_noise(noise, s, t), t) for s in shapes}
    risen = {s for s in shapes if stats.relative_change(baseline[s], candidate[s]) > recheck_bound(gates[s], t)}
    doubt = risen | (set(implausible) & set(shapes))
    zone, _, _ = geomean_zone({s: candidate[s] / baseline[s] for s in shapes}, noise, t)
    if zone not in ("no-change", "faster") or not doubt:
        return tuple(shapes)
    return tuple(sorted(doubt))


def baseline_disagreement(recorded: dict[str, float], noise: dict[str, float], run: dict[str, float],
                          t: Thresholds) -> str | None:
    """Why one run of the baseline commit (``run``: case -> median ms, any of the cases) cannot be
    the baseline whose medians were recorded (``recorded``, with their ``noise``), or None.

    It is judged as the single-run rule (``decide``) would judge it as a candidate against those
    medians: a geomean, or any case, beyond its gate and the borderline band either way is a run
    that rule would call changed, so the code did not run as it did when it was recorded (a
    co-tenant on the device, a leftover of a reverted iteration, clocks). Only the outer zones
    count: the single run's false verdicts on unchanged code are rare there, so an honest
    baseline run is seldom refused (``benchmarks/decision_power.py`` measures the cost).
    """
    cases = sorted(set(run) & set(recorded))
    if not cases:
        return None
    ratios = {c: run[c] / recorded[c] for c in cases}
    zone, agg, gate = geomean_zone(ratios, noise, t)
    if zone in ("slower", "faster"):
        return (f"the baseline commit measured geomean {format_change(agg)} against its recorded medians, "
                f"beyond its gate {gate * 100:.1f} % and the borderline band")
    floor = {c: case_noise(noise, c, t) for c in cases}
    band = t.confirm_band * t.noise_k * max(floor.values())
    for case in cases:
        change = ratios[case] - 1.0
        if abs(change) > single_run_gate(floor[case], t) + band:
            return (f"the baseline commit measured case {case} {format_change(change)} against its recorded "
                    f"median, beyond its gate {single_run_gate(floor[case], t) * 100:.1f} % and the band")
    return None


def improvement_tier(improvement: float, t: Thresholds) -> str:
    if improvement >= t.new_baseline:
        return "new-baseline"
    if improvement >= t.keep:
        return "keep-lower-priority"
    return "keep-recommend-stop"


# --- the loop over iterations -------------------------------------------------------------------


def moved_performance(entry: dict) -> bool:
    """A kept row whose numbers replaced the reference (the baseline row itself included).

    The one answer to "did this row move performance?": the history's current baseline, the stop
    rule and the evals' grader all ask it.
    """
    if entry.get("status") != "keep":
        return False
    if entry.get("iteration") == 0:
        return True
    decision = entry.get("decision") or {}
    return bool(decision.get("rebaseline", decision.get("tier") in IMPROVING_TIERS))


def current_baseline(entries: list[dict]) -> dict | None:
    """The row new candidates are compared with: the last kept row that moved performance.

    A change kept as "no-change" stays in the code, but its numbers are the old ones plus noise,
    so they do not replace the reference: otherwise noise could ratchet the baseline slower.
    """
    return next((entry for entry in reversed(entries) if moved_performance(entry)), None)


def was_interrupted(entry: dict) -> bool:
    """A row stopped before its verdict (Ctrl-C, a kill, the budget's end): it says nothing about
    the change, and ``batch`` tries its plan entry again."""
    return entry.get("crash_class") == "interrupted"


def stop_condition(history: list[dict], t: Thresholds) -> str | None:
    """One line saying why the loop should stop now, or None. ``history``: log entries, baseline first.

    Interrupted rows count towards the iteration limit (they spent an iteration number) but not
    towards patience: a try cut by the job's end was no try without improvement."""
    tries = [e for e in history if e.get("iteration", 0) > 0]
    if not tries:
        return None
    last = tries[-1]
    if last.get("iteration", 0) >= t.max_iterations:
        return f"stop: reached the limit of {t.max_iterations} iterations"
    tries = [e for e in tries if not was_interrupted(e)]
    if not tries:
        return None
    last = tries[-1]
    recent = tries[-t.patience :]
    if len(recent) == t.patience and not any(moved_performance(e) for e in recent):
        return f"stop: {t.patience} iterations in a row without improvement"
    decision = last.get("decision") or {}
    if last.get("status") == "keep" and decision.get("tier") in ("keep-recommend-stop", "no-change"):
        gain = -(decision.get("geomean_change") or 0.0)
        # A no-change keep may read a larger change than ``keep`` that its noise gate did not trust.
        measured = (f"gained {gain * 100:.1f} % (< {t.keep * 100:.0f} %)" if decision["tier"] == "keep-recommend-stop"
                    else f"changed {-gain * 100:+.1f} %, within noise")
        return f"recommend stop: the last kept change {measured}; continue only if the user asks"
    return None


def next_priority_hint(history: list[dict]) -> str | None:
    """What the seed rules say about the next optimization to try, from the last iteration."""
    tries = [e for e in history if e.get("iteration", 0) > 0]
    if not tries:
        return None
    last = tries[-1]
    tier = (last.get("decision") or {}).get("tier")
    if was_interrupted(last):
        return (f"iteration {last.get('iteration')} was stopped before its verdict (interrupted): try the change "
                "again (`cutile-perf batch` with the same plan does)")
    if last.get("status") == "crash":
        return f"iteration {last.get('iteration')} crashed ({last.get('crash_class') or 'unknown'}): fix or skip it"
    if last.get("status") == "revert":
        return "reverted: try the next optimization in priority order"
    if tier == "keep-lower-priority":
        return "gain of 2-5 %: move on to a lower-priority item of the same kind next"
    if tier == "new-baseline":
        return "gain of 5 % or more: keep exploring this direction"
    return None


# --- the device-time witness (bench/profiler.py, its module docstring) ---------------------------
#
# An event pair brackets everything one call queues on the stream, so an honest event median is
# close to the device time of the call's kernels. Measured in every bench mode with
# benchmarks/witness_check.py (the ratios: docs/results/2026-12-02-h200-trust.md, "The witness in
# every bench mode"): copies, eager multi-kernel ops and cuTile kernels read near 1, cuBLAS GEMMs
# timed by events lower (their span holds idle time the timed calls did not pay, while their summed
# kernel time matched the events, which is why bench's witness is the smaller of span and sum), and
# microsecond kernels far above 1 (the events include launch latency). WITNESS_FLOOR sits below the
# lowest honest ratio seen and still catches a record that claims half of what the device ran;
# WITNESS_SLACK_MS covers the event resolution and launch jitter. A smaller faked discount passes
# this check: docs/design.md, "Limits". Frozen: changing either changes which past rows would have been
# called tampered.
WITNESS_FLOOR = 0.6
WITNESS_SLACK_MS = 0.003


def witness_shortfall(claimed_ms: float, device_ms: float | None) -> str | None:
    """Why a record's median cannot be true given the device time the witness saw, or None."""
    if device_ms is None or not math.isfinite(device_ms) or device_ms <= 0:
        return None
    if claimed_ms + WITNESS_SLACK_MS < WITNESS_FLOOR * device_ms:
        return (f"the record claims {claimed_ms:.4f} ms per call, but the device ran {device_ms:.4f} ms of work "
                f"per profiled call (below {WITNESS_FLOOR:.0%} of it)")
    return None
