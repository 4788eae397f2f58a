"""The interleaved re-check's statistics: paired (baseline, candidate) runs of the same cases.

When a single run is borderline (``rules.decide`` says "confirm") or claims more than is plausible,
the harness runs the baseline commit and the candidate in turn, several pairs, and ``confirm``
decides from those paired samples: a bootstrap interval of the median ratio (``stats.ratio_ci``)
against the case's gate, and a paired test on the per-pair log ratios for slowdowns smaller than
any gate. ``completed`` fills the pairs still to come for ``recheck.settled_early``, which stops
the re-check once they could not change its verdict. Each rule's derivation is next to it;
``tests/test_decide.py`` holds the A/A tests.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from cutile_perf.judge import stats
from cutile_perf.judge.rules import MIN_CONFIRM_SAMPLES, Decision, Thresholds, improvement_tier, noise_floor
from cutile_perf.templating import format_change


# The paired test's one-sided 95 % level: the least evidence that a case rose at all, asked of any
# revert that rests on a gate (a practical size, estimated from few runs) rather than on the test.
SOME_RISE_Z = statistics.NormalDist().inv_cdf(0.95)

# A noise floor (``noise_floor``) estimates the width of the band runs land in; a roughly uniform
# band of width W has a standard deviation of W / sqrt(12) ~ W / 3.5.
NOISE_WIDTH_PER_SD = 3.5


# The median of n normal samples has a standard error at most sqrt(pi / 2) times the mean's (the
# large-n limit; 1.16 for 3 samples), so scaling the mean's standard error by it never overstates
# the median's certainty.
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2.0)

# ``candidate_spread``'s two-sided level, shared (Bonferroni) by every comparison it makes.
SPREAD_ALPHA = 0.01


@dataclass(frozen=True)
class PairedTest:
    """One case's per-pair log ratios log(candidate/baseline): their mean and its standard error,
    their median, the ratios themselves and the run-to-run standard deviation ``sigma`` behind ``se``."""

    mean: float
    se: float
    median: float = 0.0
    diffs: tuple = ()
    sigma: float = 0.0

    @property
    def z(self) -> float:
        return self.mean / self.se

    @property
    def robust_z(self) -> float:
        """The median's z: one pair far off (a candidate fast in one process only) moves the mean, and
        with it ``z``, as far as it likes, but the median of three pairs not at all."""
        return self.median / (self.se * MEDIAN_SE_FACTOR)


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
        out[case] = PairedTest(statistics.fmean(diffs), sigma * math.sqrt(2.0 / n), statistics.median(diffs),
                               tuple(diffs), sigma)
    return out


def candidate_spread(tests: dict[str, PairedTest]) -> str | None:
    """Why the candidate's runs disagree among themselves more than the baseline's noise model
    allows, or None. A bimodal candidate (fast in some processes only) or a drifting one (fast in
    its first processes only) shows it; code that runs alike every time does not.

    Per case, the values compared are its per-pair log ratios (``tests``). Each is a difference of
    two runs, with a standard deviation of sqrt(2) x ``sigma``, so two of them differ by 2 x
    ``sigma`` in standard deviation. Any two further apart than the normal quantile of
    ``SPREAD_ALPHA``, shared by every comparison made (Bonferroni over cases x pairs of pairs),
    disagree: on code that runs alike every time at most ``SPREAD_ALPHA`` of checks say so.
    """
    values = {c: list(test.diffs) for c, test in tests.items()}
    comparisons = sum(len(v) * (len(v) - 1) // 2 for v in values.values())
    if not comparisons:
        return None
    z = statistics.NormalDist().inv_cdf(1.0 - SPREAD_ALPHA / 2.0 / comparisons)
    worst, excess = None, 0.0
    for case, logs in values.items():
        if len(logs) > 1:
            gap = (max(logs) - min(logs)) / (2.0 * tests[case].sigma)
            if gap > z and gap > excess:
                worst, excess = case, gap
    if worst is None:
        return None
    logs = values[worst]
    return (f"the candidate's runs of case {worst} disagree: {format_change(math.exp(min(logs)) - 1)} to "
            f"{format_change(math.exp(max(logs)) - 1)} against the baseline, {excess:.1f} sd apart where the "
            f"baseline's noise allows {z:.1f} (fast in some processes only?)")


def geomean_z(tests: dict[str, PairedTest]) -> float:
    """The paired test of the geomean: the mean of the cases' per-pair log ratios over the root mean
    square of their standard errors (not divided by sqrt(cases): drift that is left inside a pair
    moves every case alike)."""
    return (statistics.fmean(test.mean for test in tests.values())
            / math.sqrt(statistics.fmean(test.se ** 2 for test in tests.values())))


def completed(paired: dict[str, tuple[list[float], list[float]]], prior_runs: dict[str, list[float]] | None,
              minimum: float, pairs: int, shift_sd: float, base_sd: float = 0.0
              ) -> dict[str, tuple[list[float], list[float]]]:
    """``paired`` with every case filled up to ``pairs`` pairs by runs it has not had yet.

    Each added candidate run sits at the geometric centre of the case's baseline runs so far times
    ``exp(mean + shift_sd * sd)``: the case's mean per-pair log ratio so far, moved by ``shift_sd``
    of its per-pair standard deviations (``paired_log_ratios``' spread, sqrt(2) x the run-to-run
    one). Positive: slower than the pairs so far; negative: faster. Each added baseline run sits
    ``base_sd`` run-to-run standard deviations above, then below, that centre: 0 adds no spread (the
    narrowest noise floor, every rule at its most decisive), more widens the floor and the spread
    as unlucky runs would. Every case needs at least one pair.
    """
    if empty := [case for case, (base, cand) in paired.items() if not (base and cand)]:
        raise ValueError(f"completed needs at least one pair of every case; {', '.join(empty)} has none")
    tests = paired_log_ratios(paired, prior_runs, minimum)
    out = {}
    for case, (base, cand) in paired.items():
        n = min(len(base), len(cand))
        centre = math.exp(statistics.fmean(math.log(v) for v in base[:n]))
        per_pair_sd = tests[case].se * math.sqrt(n)
        run_sd = per_pair_sd / math.sqrt(2.0)
        added = range(max(0, pairs - n))
        step = centre * math.exp(tests[case].mean + shift_sd * per_pair_sd)
        bases = [centre * math.exp((1 if i % 2 == 0 else -1) * base_sd * run_sd) for i in added]
        out[case] = ([*base[:n], *bases], [*cand[:n], *[step for _ in added]])
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
    # samples under-covers), so an overall verdict also needs the per-pair test (``geomean_z``).
    z_geo = geomean_z(tests)
    needed_geo = slower_threshold(t, 1)  # one test: the geomean
    geo = (f"geomean {format_change(ratio - 1)}, interval {ci(low, high)}, gate {agg_gate * 100:.1f} %, "
           f"z = {z_geo:.1f} (interleaved)")
    if low - 1.0 > agg_gate and z_geo > needed_geo:
        return Decision("revert", "regression", f"{geo}: slower overall", **made)
    if 1.0 - high > agg_gate and -z_geo > needed_geo:
        tier = improvement_tier(1.0 - ratio, t)
        return Decision("keep", tier, f"{geo}: faster ({tier})", rebaseline=True, **made)
    return Decision("keep", "no-change", f"{geo}: within noise, kept without moving the baseline", **made)


def _per_pair_geomeans(paired, shapes) -> tuple[list[float], list[float]]:
    """Geomean over shapes of each interleaved round; rounds are aligned by position."""
    rounds = min(min(len(paired[s][0]), len(paired[s][1])) for s in shapes)
    base = [stats.geomean([paired[s][0][i] for s in shapes]) for i in range(rounds)]
    cand = [stats.geomean([paired[s][1][i] for s in shapes]) for i in range(rounds)]
    return base, cand
