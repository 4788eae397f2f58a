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
import statistics
from dataclasses import asdict, dataclass, field, fields, replace

from cutile_perf.judge import stats
from cutile_perf.templating import format_change

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

    def __post_init__(self):
        for name in ("new_baseline", "keep", "regression_tolerance", "noise_k", "min_noise", "confirm_band",
                     "min_plausible_ms", "recheck_fraction", "slower_z"):
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
    source: str = "single"  # "single": one candidate run; "confirm": interleaved paired samples
    paired_z: dict = field(default_factory=dict)  # shape -> z of its paired slowdown test (confirm only)

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
    agg = stats.geomean([candidate[s] / baseline[s] for s in shapes]) - 1.0
    agg_noise = _aggregate_noise(floor, shapes, t.min_noise)
    agg_gate, agg_band = t.noise_k * agg_noise, t.confirm_band * t.noise_k * widest
    made = dict(changes=changes, gates=gates, geomean_change=agg, worst_shape=worst)
    slower = f"shape {worst} {format_change(changes[worst])} vs baseline (gate {gates[worst] * 100:.1f} %)"

    if changes[worst] > gates[worst] + bands[worst]:
        return Decision("revert", "regression", f"{slower}: slower", **made)
    if changes[worst] > gates[worst]:
        return Decision("confirm", "borderline", f"{slower}: borderline slower, re-measure interleaved", **made)
    # Every case is checked, not only the one nearest its gate: a quiet case's small rise can sit
    # nearer its gate than a noisy case's larger one, which would then go unchecked.
    unclear = [s for s in shapes if changes[s] > max(t.regression_tolerance, t.recheck_fraction * gates[s])]
    if unclear:
        risen = max(unclear, key=lambda s: changes[s] / gates[s])
        return Decision("confirm", "borderline", f"shape {risen} {format_change(changes[risen])} vs baseline (gate "
                        f"{gates[risen] * 100:.1f} %): within noise but not clearly, re-measure interleaved", **made)
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


# The paired test's one-sided 95 % level: the least evidence that a case rose at all, asked of any
# revert that rests on a gate (a practical size, estimated from few runs) rather than on the test.
SOME_RISE_Z = statistics.NormalDist().inv_cdf(0.95)

# A noise floor (``noise_floor``) estimates the width of the band runs land in; a roughly uniform
# band of width W has a standard deviation of W / sqrt(12) ~ W / 3.5.
NOISE_WIDTH_PER_SD = 3.5


@dataclass(frozen=True)
class PairedTest:
    """One case's per-pair log ratios log(candidate/baseline): their mean and its standard error."""

    mean: float
    se: float

    @property
    def z(self) -> float:
        return self.mean / self.se


def paired_log_ratios(paired: dict[str, tuple[list[float], list[float]]], prior_runs: dict[str, list[float]] | None,
                      minimum: float) -> dict[str, PairedTest]:
    """Per case: the mean of the per-pair log ratios and its standard error (``PairedTest``).

    Pairs are interleaved, so drift between rounds cancels inside each pair. The run-to-run spread
    is the larger of two estimates: one pooled over every case (from the baseline side of the pairs
    and the baseline's own repeated runs, ``prior_runs``: more degrees of freedom than any case has
    alone) and the case's own. So neither three samples that agree by luck nor a quiet neighbour
    can shrink a noisy case's spread. Never below ``minimum`` read as a band width.
    """
    def spread(groups) -> tuple[float, int]:
        squares, dof = 0.0, 0
        for samples in groups:
            if len(samples) > 1:
                logs = [math.log(v) for v in samples]
                centre = statistics.fmean(logs)
                squares += sum((x - centre) ** 2 for x in logs)
                dof += len(logs) - 1
        return squares, dof

    prior_runs = prior_runs or {}
    squares, pooled_dof = spread([base for base, _cand in paired.values()] + list(prior_runs.values()))
    pooled = math.sqrt(squares / pooled_dof) if pooled_dof else 0.0
    out = {}
    for case, (base, cand) in paired.items():
        own_squares, own_dof = spread([base, prior_runs.get(case, [])])
        own = math.sqrt(own_squares / own_dof) if own_dof else 0.0
        # The larger of the pooled spread and this case's own: a quiet neighbour cannot shrink it.
        sigma = max(pooled, own, minimum / NOISE_WIDTH_PER_SD)
        n = min(len(base), len(cand))
        diffs = [math.log(cand[i] / base[i]) for i in range(n)]
        out[case] = PairedTest(statistics.fmean(diffs), sigma * math.sqrt(2.0 / n))
    return out


def slower_threshold(t: Thresholds, cases: int) -> float:
    """How many standard errors a case's paired mean must exceed to count as slower.

    ``slower_z`` is the one-sided threshold for a single case. Testing several cases at once
    raises the chance that one of them crosses it by luck as many times (Bonferroni), so the
    threshold rises with the number of cases to keep an unchanged kernel's false-revert rate:
    3.09 for 3 cases, 3.43 for 10 at the default 2.75. (Taking the larger of the pooled and the
    case's own spread, ``paired_log_ratios``, already errs on the careful side, which is why the
    normal distribution, not Student's t, is used here; ``benchmarks/decision_power.py`` and
    ``tests/test_decide.py``'s A/A tests measure the resulting rates.)
    """
    per_case_alpha = (1.0 - statistics.NormalDist().cdf(t.slower_z)) / max(1, cases)
    return statistics.NormalDist().inv_cdf(1.0 - per_case_alpha)


def confirm(paired: dict[str, tuple[list[float], list[float]]], t: Thresholds,
            prior_runs: dict[str, list[float]] | None = None) -> Decision:
    """Final verdict from an interleaved re-measurement: ``{shape: (baseline_samples, candidate_samples)}``.

    Each sample is one run's median. A shape is slower when the whole ``t.confidence`` interval of
    median(candidate)/median(baseline) lies beyond its gate, ``max(tolerance, noise of the baseline
    samples)``: the interval already carries the statistics, the gate the practical size. An
    improvement needs the interval of the per-pair geomean ratio to lie below ``1 - gate``.

    A second slowdown rule works on the per-pair log ratios (``paired_log_ratios``): a case whose
    mean exceeds ``slower_threshold`` standard errors (``slower_z`` raised for the number of
    cases) is slower. It catches a real slowdown smaller than the gate, which the interval rule
    lets through; with every candidate judged against the baseline commit, such small slowdowns
    cannot add up over several "within noise" keeps. The same test backs every other verdict here:
    a revert on a gate needs it to see some rise (``SOME_RISE_Z``), and a geomean verdict needs it
    to agree at ``slower_threshold`` for one test.
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

    tests = paired_log_ratios(paired, prior_runs, t.min_noise)
    made["paired_z"] = {s: tests[s].z for s in shapes}
    # A gate from three baseline samples can be tiny by luck, so a revert for crossing it also needs
    # the pairs to show a rise at all (``SOME_RISE_Z``).
    if intervals[worst][1] - 1.0 > gates[worst] and tests[worst].z > SOME_RISE_Z:
        return Decision("revert", "regression", f"shape {worst} {format_change(changes[worst])} slower, interval "
                        f"{ci(*intervals[worst][1:])} beyond gate {gates[worst] * 100:.1f} % (interleaved)", **made)
    needed = slower_threshold(t, len(shapes))
    surest = max(shapes, key=lambda s: tests[s].z)
    # Both the paired test and the bootstrap interval (which excludes no change) must say slower.
    if (tests[surest].z > needed and intervals[surest][1] > 1.0
            and changes[surest] > t.regression_tolerance):
        return Decision("revert", "regression", f"shape {surest} {format_change(changes[surest])} slower in every "
                        f"sense the pairs allow: z = {tests[surest].z:.1f} > {needed:.2f} (interleaved)",
                        **{**made, "worst_shape": surest})
    # The geomean's interval from three or so rounds is narrow by luck too often (a bootstrap of few
    # samples under-covers), so an overall verdict also needs the per-pair test: the mean of the
    # cases' log ratios over the root mean square of their standard errors (not divided by
    # sqrt(cases): drift that is left inside a pair moves every case alike).
    z_geo = (statistics.fmean(test.mean for test in tests.values())
             / math.sqrt(statistics.fmean(test.se ** 2 for test in tests.values())))
    needed_geo = slower_threshold(t, 1)  # one test: the geomean
    geo = (f"geomean {format_change(ratio - 1)}, interval {ci(low, high)}, gate {agg_gate * 100:.1f} %, "
           f"z = {z_geo:.1f} (interleaved)")
    if low - 1.0 > agg_gate and z_geo > needed_geo:
        return Decision("revert", "regression", f"{geo}: slower overall", **made)
    if 1.0 - high > agg_gate and -z_geo > needed_geo:
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


# --- the judge: every rule that turns a stage's evidence into a verdict ----------------------------


@dataclass(frozen=True)
class Reference:
    """What a candidate is judged against: the current baseline, never a later "no-change" keep."""

    commit: str  # the baseline commit: the interleaved re-check measures this code again
    medians: dict  # case -> median ms of the baseline
    noise: dict  # case -> relative noise floor
    passed_tests: frozenset = frozenset()  # correctness test ids that passed at the baseline
    kernel_names: dict = field(default_factory=dict)  # case -> kernel_name the baseline record carried
    runs: dict = field(default_factory=dict)  # case -> the baseline's per-run medians (the noise sample)


@dataclass(frozen=True)
class StageEvidence:
    """What one pytest child showed (``measure.run_stage``), reduced to the facts the rules need."""

    problem: str | None = None  # crash class value found by the runner or the integrity checks
    detail: str = ""
    ended: bool = True  # the plugin's end-of-session marker is there
    passed: frozenset = frozenset()
    not_passed: dict = field(default_factory=dict)  # test id -> outcome, for tests that did not pass
    medians: dict = field(default_factory=dict)  # case -> median ms (perf)


@dataclass(frozen=True)
class Verdict:
    action: str  # "keep", "revert", "crash", "continue" (run the next stage), "re-measure"
    reason: str = ""
    crash_class: str | None = None
    decision: Decision | None = None
    review: bool = False  # a claim beyond the plausibility factor: flagged for a human

    @property
    def final(self) -> bool:
        return self.action in ("keep", "revert", "crash")


def _crash(problem: str, reason: str) -> Verdict:
    return Verdict("revert" if problem == "wrong-result" else "crash", reason, crash_class=problem)


def judge_correctness(ev: StageEvidence, ref: Reference) -> Verdict:
    """Correctness is positive evidence: tests ran, the baseline's passing tests pass again, the run ended."""
    if ev.problem:
        return _crash(ev.problem, f"correctness {ev.problem}: {ev.detail}")
    if not ev.ended:
        return _crash("incomplete-tests", "correctness: the test session ended before the plugin's end marker "
                      "(exit during the run?)")
    if not ev.passed:
        return _crash("incomplete-tests", "correctness: no test passed")
    lost = sorted(ref.passed_tests - ev.passed)
    if lost:
        how = ev.not_passed.get(lost[0], "missing")
        return _crash("incomplete-tests", f"correctness: {len(lost)} test(s) that passed at the baseline did not "
                      f"pass now, e.g. {lost[0]} ({how})")
    return Verdict("continue")


def judge_records(ev: StageEvidence, ref: Reference, t: Thresholds) -> Verdict:
    """A perf run counts only with an end marker and a finite, plausible record for every baseline case."""
    if ev.problem:
        return _crash(ev.problem, f"perf {ev.problem}: {ev.detail}")
    if not ev.ended:
        return _crash("incomplete-tests", "perf: the test session ended before the plugin's end marker")
    missing = sorted(set(ref.medians) - set(ev.medians))
    if missing:
        return _crash("no-record", f"perf: no record for {len(missing)} baseline case(s), e.g. {missing[0]}")
    for case in sorted(ev.medians):
        value = ev.medians[case]
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= t.min_plausible_ms):
            return _crash("bad-record", f"perf: case {case} recorded median {value!r} ms (needs a finite time >= "
                          f"{t.min_plausible_ms:g} ms)")
    return Verdict("continue")


def implausible_cases(ref: Reference, medians: dict, t: Thresholds) -> list[str]:
    """Cases whose claimed speedup over the baseline exceeds the plausibility factor."""
    return sorted(c for c in ref.medians if c in medians and ref.medians[c] / medians[c] > t.plausible_factor)


def judge(ref: Reference, t: Thresholds, *, correctness: StageEvidence | None = None,
          perf: StageEvidence | None = None, paired: dict | None = None) -> Verdict:
    """The verdict from whatever evidence exists so far; ``continue``/``re-measure`` ask for more.

    Order: correctness (positive evidence) -> records (complete, finite, plausible) -> one run
    against the baseline medians -> the interleaved re-check against the baseline *commit*, needed
    when the single run is borderline or claims more than ``plausible_factor`` on some case.
    """
    if correctness is not None:
        verdict = judge_correctness(correctness, ref)
        if verdict.final or perf is None:
            return verdict
    if perf is None:
        return Verdict("continue")
    verdict = judge_records(perf, ref, t)
    if verdict.final:
        return verdict
    cases = sorted(ref.medians)
    implausible = implausible_cases(ref, perf.medians, t)
    if paired is None:
        single = decide({c: ref.medians[c] for c in cases}, {c: perf.medians[c] for c in cases}, ref.noise, t)
        if single.verdict == "confirm" or (implausible and single.verdict == "keep"):
            why = (f"claims more than {t.plausible_factor:g}x on {', '.join(implausible)}" if implausible
                   else single.reason)
            return Verdict("re-measure", why, decision=single)
        return Verdict(single.verdict, single.reason, decision=single)
    rounds = min(min(len(paired[c][0]), len(paired[c][1])) for c in cases)
    if rounds < t.min_confirm_pairs:
        return Verdict("re-measure", f"{rounds} of {t.min_confirm_pairs} interleaved pairs")
    confirmed = confirm(paired, t, ref.runs)
    if confirmed.tier == "no-change" and rounds < t.max_confirm_pairs:
        return Verdict("re-measure", "ambiguous after the interleaved pairs so far", decision=confirmed)
    if confirmed.tier == "no-change":
        # "Within noise" never keeps code whose paired median sits beyond the case's gate: the kept
        # HEAD may not drift past the gate, however the statistics above came out.
        for case in cases:
            gate = single_run_gate(case_noise(ref.noise, case, t), t)
            change = confirmed.changes.get(case, 0.0)
            if change > gate and confirmed.paired_z.get(case, 0.0) > SOME_RISE_Z:
                reason = (f"shape {case} {format_change(change)} vs the baseline commit, beyond its gate "
                          f"{gate * 100:.1f} % (interleaved median ratio)")
                decision = replace(confirmed, verdict="revert", tier="regression", reason=reason, worst_shape=case)
                return Verdict("revert", reason, decision=decision)
    still = [c for c in cases if stats.median(paired[c][0]) / stats.median(paired[c][1]) > t.plausible_factor]
    review = bool(implausible) and confirmed.verdict == "keep"
    reason = confirmed.reason + (f"; re-measured: {', '.join(still) or 'no case'} still beyond "
                                 f"{t.plausible_factor:g}x, marked for review" if review else "")
    return Verdict(confirmed.verdict, reason, decision=confirmed, review=review)
