"""The interleaved re-check's rules: a verdict from the pairs of baseline and candidate runs.

``judge_paired`` judges a re-check of every case, ``judge_partial`` one of only the cases the single
run left in doubt, combined with the others' single-run figures. Both stop early when the pairs to
come could not change the outcome (``settled_early``), unless the candidate's own runs disagree
(``unsettled``, ``unstable``): a keep never rests on one lucky process (issue 39).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from cutile_perf.judge import stats
from cutile_perf.judge.evidence import Reference, Verdict, asked_cases, case_names
from cutile_perf.judge.paired import (SOME_RISE_Z, candidate_spread, completed, confirm, geomean_z,
                                      paired_log_ratios)
from cutile_perf.judge.rules import (Decision, Thresholds, case_noise, geomean_zone,
                                     improvement_tier, single_run_gate)
from cutile_perf.templating import format_change


def paired_samples(pairs, cases) -> dict[str, tuple[list[float], list[float]]]:
    """Per case, its (baseline runs, candidate runs) from the complete interleaved pairs whose runs
    were asked for it (a run that names no cases was asked for all), in order. A pair with a run
    that crashed (killed by the job's budget, say) measured nothing: the row of its crash still
    shows the pairs before it."""
    out: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in cases}
    for base, cand in pairs:
        if cand is None or not (base.ok and cand.ok):
            continue
        for c in cases:
            if c in (base.cases or cases) and c in (cand.cases or cases):
                out[c][0].append(base.shapes[c])
                out[c][1].append(cand.shapes[c])
    return out


def settled_early(ref: Reference, t: Thresholds, measured: dict, rounds: int,
                  verdict_at: Callable[[dict], Verdict | None], note: str | None = None) -> Verdict | None:
    """The re-check's verdict after ``rounds`` pairs, short of ``min_confirm_pairs``, when the pairs
    still to come cannot change it; None when they might.

    ``verdict_at`` judges ``measured`` ({case: (baseline runs, candidate runs)}, the cases the
    re-check measures) filled up to ``min_confirm_pairs`` pairs (``paired.completed``). It is asked
    at the middle (every pair to come at each case's mean per-pair ratio so far) and at four ends:
    the candidate ``settle_sd`` per-pair standard deviations slower or faster than that, each with
    baseline runs that add no spread or ``settle_sd`` run-to-run deviations of it. A slower
    candidate moves every rule towards "revert", a faster one towards "keep", and the baseline's
    spread sets how far either may go (a narrow one lets a small change decide, a wide one lets
    none). When all five agree on the action, and on whether the baseline moves, the pairs to come
    would have to land beyond those ends to change it.

    The verdict is the middle one's, with ``Decision.settled_after`` set to ``rounds``; its figures
    (``changes``, ``paired_z``, ``geomean_change`` and the reason's) are those of the pairs that ran,
    never the filled-in ones, whose intervals and z would claim more certainty than was measured.
    ``note`` (the partial re-check's) ends the reason.
    """
    if t.settle_sd <= 0 or rounds < 1:
        return None
    m = t.settle_sd
    # The middle first, then the ends most likely to disagree with it: judging stops at the first
    # disagreement, and each judgement bootstraps every case.
    ends = [(0.0, 0.0), (-m, m), (m, 0.0), (-m, 0.0), (m, m)]
    outcomes = []
    for shift, spread in ends:
        outcome = verdict_at(completed(measured, ref.runs, t.min_noise, t.min_confirm_pairs, shift, spread))
        if outcome is None or not outcome.final or outcome.decision is None:
            return None
        outcomes.append(outcome)
        if len({(v.action, v.decision.rebaseline) for v in outcomes}) > 1:
            return None
    middle = outcomes[0].decision
    tests = paired_log_ratios(measured, ref.runs, t.min_noise)
    changes = {**middle.changes, **{c: math.exp(test.mean) - 1.0 for c, test in tests.items()}}
    geo = stats.geomean([1.0 + v for v in changes.values()]) - 1.0
    rising = max(tests, key=lambda c: tests[c].z)
    if middle.verdict == "revert":
        outcome = f"slower ({middle.worst_shape}): reverted"
    elif middle.rebaseline:
        outcome = f"faster ({middle.tier})"
    else:
        outcome = "within noise, kept without moving the baseline"
    if middle.source == "confirm":  # every case re-measured
        figures = f"geomean {format_change(geo)}, z = {geomean_z(tests):.1f}; "
    else:
        figures = f"geomean {format_change(geo)} with the cases not re-measured at their single run; "
    figures += f"highest paired z: {rising} {format_change(changes[rising])}, z = {tests[rising].z:.1f}"
    reason = (f"{outcome}, settled after {rounds} of {t.min_confirm_pairs} interleaved pairs; they measured "
              f"{figures}; the pairs to come, within {m:g} sd of these, could not change it"
              + (f"; {note}" if note else "")
              + (f"; a claim beyond {t.plausible_factor:g}x, marked for review" if outcomes[0].review else ""))
    decision = replace(middle, reason=reason, settled_after=rounds, changes=changes, geomean_change=geo,
                       paired_z={**middle.paired_z, **{c: test.z for c, test in tests.items()}})
    return replace(outcomes[0], reason=reason, decision=decision)


def _keeps(verdict: Verdict | None) -> bool:
    return verdict is not None and verdict.action == "keep"


def unsettled(ref: Reference, t: Thresholds, measured: dict, first: dict | None, implausible, repeat_of,
              settled: Verdict) -> str | None:
    """Why a re-check that would keep may not stop before ``min_confirm_pairs`` on the pairs so far,
    or None (a revert settles as before: refusing a change needs no proof of its spread).

    A claim beyond ``plausible_factor`` and content reverted before are judged on every pair: a
    candidate fast only in its first two processes was kept at -70 % after one pair, and one fast
    in 30 % of its processes on its 7th identical try (issue 39). Nor does a re-check settle while
    the candidate's runs disagree among themselves beyond the baseline's noise (``candidate_spread``,
    and ``first_run_disagrees`` for its single run, ``first``): the filled-in
    pairs of ``settled_early`` assume the runs to come look like those so far. Nor does a keep that
    would move the baseline: the candidate's spread shows only in its runs, and two fast ones of a
    candidate fast in 30 % of its processes kept it "settled after 1 pair" in 9 % of sessions
    (``benchmarks/decision_power.py``'s bimodal row); all four it then needs agree in under 1 %."""
    if implausible:
        return f"a claim beyond {t.plausible_factor:g}x is judged on every pair"
    if repeat_of is not None:
        return f"the same content was reverted at iteration {repeat_of}: judged on every pair"
    tests = paired_log_ratios(measured, ref.runs, t.min_noise)
    spread = candidate_spread(tests) or first_run_disagrees(ref, t, tests, first or {})
    if spread is None and settled.decision is not None and settled.decision.rebaseline:
        return "a keep that moves the baseline rests on every pair (the candidate's own spread)"
    return spread


def unstable(ref: Reference, t: Thresholds, measured: dict, first: dict, prior: dict | None,
             repeat_of: int | None, moves_baseline: bool) -> str | None:
    """Why the candidate's own runs disagree, so that no keep may rest on them, or None: its runs in
    the pairs among themselves (``candidate_spread``), what the same content measured when it was
    reverted before against them (``earlier_runs_disagree``), and, for a keep that would move the
    baseline, its single run against them (``first_run_disagrees``: a +10 % single run, then three
    fast pairs, kept a change fast in 30 % of its processes as the new reference). One fast pair of three flipped the paired sign of a
    +10 % change, which "within noise" then kept (issue 39)."""
    tests = paired_log_ratios(measured, ref.runs, t.min_noise)
    spread = candidate_spread(tests) if wide_apart(ref, t, tests) else None
    # The single run against the pairs does not revert a within-noise keep: that turned an unchanged
    # candidate's lucky single run into "unstable" (A/A false reverts, decision_power.py --only issue9).
    return (spread or earlier_runs_disagree(ref, t, tests, first, prior or {}, repeat_of)
            or (first_run_disagrees(ref, t, tests, first) if moves_baseline else None))


def wide_apart(ref: Reference, t: Thresholds, tests: dict) -> bool:
    """Whether some case's pairs span more than the single run's allowance (``_allowance``): a
    practical size for ``candidate_spread``'s statistics, which alone would revert an honest big
    gain whose shorter runs jitter a little more, relative to their time, than the baseline's."""
    allowance = _allowance(ref, t, tests)
    return any(test.diffs and math.exp(max(test.diffs) - min(test.diffs)) - 1.0 > allowance[case]
               for case, test in tests.items())


def unstable_revert(decision: Decision, why: str) -> Verdict:
    """The revert of a candidate whose runs disagree (``unstable``): it has no one speed to keep, nor
    to become the reference."""
    reason = f"unstable: {why}; a change without one speed is not kept"
    return Verdict("revert", reason, decision=replace(decision, verdict="revert", tier="unstable", rebaseline=False,
                                                      reason=reason))


def _allowance(ref: Reference, t: Thresholds, cases) -> dict[str, float]:
    """Per case, how far two of the candidate's ratios measured apart may differ: the single-run
    rule's gate plus the borderline band, as ``first_run_disagrees`` allows."""
    floor = {c: case_noise(ref.noise, c, t) for c in cases}
    band = t.confirm_band * t.noise_k * max(floor.values(), default=t.min_noise)
    return {c: single_run_gate(floor[c], t) + band for c in cases}


def earlier_runs_disagree(ref: Reference, t: Thresholds, tests: dict, first: dict, prior: dict,
                          repeat_of: int | None) -> str | None:
    """Why a ratio this content measured when it was reverted before (``prior``: case -> ratios)
    and one it measures now (the single run, ``first``, and each pair) disagree beyond the single
    run's allowance, or None. Tried again until one lucky run keeps it, a candidate fast in 30 % of
    its processes was kept in 61 of 100 sessions; its earlier slow runs are evidence too."""
    cases = sorted(set(tests) & set(prior))
    allowed = _allowance(ref, t, tests)
    for case in cases:
        now = [math.exp(d) for d in tests[case].diffs] + ([first[case]] if case in first else [])
        for before in prior[case]:
            for ratio in now:
                if abs(ratio / before - 1.0) > allowed[case]:
                    return (f"case {case} measured {format_change(before - 1)} when this content was reverted "
                            f"(iteration {repeat_of}) and {format_change(ratio - 1)} now, apart beyond its gate "
                            f"and band {allowed[case] * 100:.1f} % (fast in some processes only?)")
    return None


def first_run_disagrees(ref: Reference, t: Thresholds, tests: dict, first: dict) -> str | None:
    """Why the candidate's single run (``first``: case -> its ratio to the recorded median) and a
    pair so far disagree by more than the single-run rule calls a change (a case's gate and the
    borderline band), or None. The single run was measured apart from the pairs, against the
    recorded medians, so it is given the single run's own allowance, not the pairs' spread."""
    allowance = _allowance(ref, t, tests)
    for case in sorted(set(tests) & set(first)):
        allowed = allowance[case]
        for diff in tests[case].diffs:
            if abs(math.exp(diff) / first[case] - 1.0) > allowed:
                return (f"the candidate's single run of case {case} ({format_change(first[case] - 1)}) and a pair "
                        f"({format_change(math.exp(diff) - 1)}) disagree beyond its gate and band "
                        f"{allowed * 100:.1f} % (fast in some processes only?)")
    return None


def beyond_gate(ref: Reference, t: Thresholds, measured: dict, changes: dict, gates: dict) -> str | None:
    """The first re-measured case whose paired median ratio sits beyond its single-run gate with a
    rise the pairs support, or None: "within noise" never keeps such a case. The rise is asked of
    the mean per-pair log ratio or their median (``PairedTest.robust_z``): one fast pair flips the
    mean's sign however slow the others were, never the median of three."""
    tests = paired_log_ratios(measured, ref.runs, t.min_noise)
    return next((case for case in sorted(measured)
                 if changes.get(case, 0.0) > gates[case] and max(tests[case].z, tests[case].robust_z) > SOME_RISE_Z), None)


def judge_partial(ref: Reference, t: Thresholds, single: dict, doubt: tuple[str, ...], paired: dict,
                  implausible: list[str], repeat_of: int | None = None, *, prior: dict | None = None,
                  own_spread: bool = True) -> Verdict | None:
    """The verdict when the re-check re-measured only the cases in doubt (``rules.cases_in_doubt``
    derives why it is valid), or None when the geomean is in doubt and the whole re-check decides.

    The cases in doubt get ``confirm``'s slowdown tests (Bonferroni over the cases re-measured);
    its geomean is theirs alone, so the verdict's is taken again over every case, each re-measured
    case at its paired median ratio and the others at their single-run ratio, by the single run's
    zones. Otherwise this mirrors ``judge_paired``: more pairs while it would be "no-change" and
    fewer than ``max_confirm_pairs`` ran, a "no-change" never keeps a case whose paired median sits
    beyond its gate, a candidate whose runs disagree (``unstable``) is reverted, and a claim beyond
    ``plausible_factor`` is marked for review.
    """
    cases = sorted(ref.medians)
    rounds = min(min(len(paired[c][0]), len(paired[c][1])) for c in doubt)
    measured = {c: paired[c] for c in doubt}
    note = (f"{len(doubt)} of {len(cases)} cases re-measured interleaved ({case_names(doubt)}), the others as the "
            "single run measured them")
    first = {c: single[c] / ref.medians[c] for c in doubt}
    if rounds < t.min_confirm_pairs:
        settled = settled_early(ref, t, measured, rounds, lambda filled: judge_partial(
            ref, t, single, doubt, {**paired, **filled}, implausible, own_spread=False), note)
        barrier = unsettled(ref, t, measured, first, implausible, repeat_of, settled) if _keeps(settled) else None
        if settled is not None and not barrier:
            return settled
        return Verdict("re-measure", f"{rounds} of {t.min_confirm_pairs} interleaved pairs of the {len(doubt)} "
                       "cases in doubt" + (f"; not settled early: {barrier}" if barrier else ""), cases=doubt)
    confirmed = confirm(measured, t, ref.runs)
    ratios = {c: single[c] / ref.medians[c] for c in cases}
    ratios.update({c: 1.0 + confirmed.changes[c] for c in doubt})
    zone, agg, agg_gate = geomean_zone(ratios, ref.noise, t)
    single_gates = {c: single_run_gate(case_noise(ref.noise, c, t), t) for c in cases}
    changes = {c: ratios[c] - 1.0 for c in cases}
    gates = {**single_gates, **{c: confirmed.gates[c] for c in doubt}}
    made = dict(changes=changes, gates=gates, geomean_change=agg, source="partial", paired_z=confirmed.paired_z,
                rechecked=list(doubt), worst_shape=max(cases, key=lambda c: changes[c] - gates[c]))
    if confirmed.verdict == "revert":
        reason = f"{confirmed.reason}; {note}"
        return Verdict("revert", reason, decision=Decision("revert", "regression", reason,
                                                           **{**made, "worst_shape": confirmed.worst_shape}))
    if zone not in ("no-change", "faster"):
        return None  # the geomean is in doubt: it rests on every case, so the others are re-measured too
    geo = f"geomean {format_change(agg)} (gate {agg_gate * 100:.1f} %)"
    if zone == "faster":
        tier = improvement_tier(-agg, t)
        decision = Decision("keep", tier, f"{geo}: faster ({tier}); {note}", rebaseline=True, **made)
    else:
        decision = Decision("keep", "no-change", f"{geo}: within noise, kept without moving the baseline; {note}",
                            **made)
    spread = unstable(ref, t, measured, first, prior, repeat_of, decision.rebaseline) if own_spread else None
    if spread:
        if rounds < t.max_confirm_pairs:
            return Verdict("re-measure", f"{decision.tier}, but {spread}", decision=decision, cases=doubt)
        return unstable_revert(decision, f"{spread}; {note}")
    if zone != "faster":
        if rounds < t.max_confirm_pairs:
            return Verdict("re-measure", "ambiguous after the interleaved pairs so far", decision=decision,
                           cases=doubt)
        case = beyond_gate(ref, t, measured, changes, single_gates)  # as judge_paired
        if case is not None:
            reason = (f"shape {case} {format_change(changes[case])} vs the baseline commit, beyond its gate "
                      f"{single_gates[case] * 100:.1f} % (interleaved median ratio); {note}")
            return Verdict("revert", reason, decision=replace(decision, verdict="revert", tier="regression",
                                                              reason=reason, worst_shape=case))
    still = [c for c in doubt if stats.median(paired[c][0]) / stats.median(paired[c][1]) > t.plausible_factor]
    review = bool(implausible)
    reason = decision.reason + (f"; re-measured: {', '.join(still) or 'no case'} still beyond "
                                f"{t.plausible_factor:g}x, marked for review" if review else "")
    return Verdict("keep", reason, decision=decision, review=review)


def judge_paired(ref: Reference, t: Thresholds, paired: dict, implausible: list[str], *,
                 first: dict | None = None, repeat_of: int | None = None, prior: dict | None = None,
                 own_spread: bool = True) -> Verdict:
    """The verdict from interleaved pairs ``{case: (baseline runs, candidate runs)}`` of every case.
    ``first``: case -> the single run's ratio to the recorded median; ``repeat_of``, ``prior``:
    ``Evidence``'s. A keep whose candidate runs disagree (``unstable``) is reverted; ``own_spread``
    False skips that for ``settled_early``'s filled-in pairs, whose spread is the model's, not the
    candidate's (``unsettled`` checks the real pairs' before a settled keep stands).

    After a partial re-check whose geomean came out in doubt, the cases not re-measured yet have
    fewer pairs: the next runs measure those (``Verdict.cases``) until every case has as many."""
    cases = sorted(ref.medians)
    per_case = {c: min(len(paired[c][0]), len(paired[c][1])) for c in cases}
    rounds = min(per_case.values())
    behind = asked_cases([c for c in cases if per_case[c] == rounds], cases)
    if rounds < t.min_confirm_pairs:
        settled = settled_early(ref, t, paired, rounds,
                                lambda filled: judge_paired(ref, t, filled, implausible, own_spread=False))
        barrier = unsettled(ref, t, paired, first, implausible, repeat_of, settled) if _keeps(settled) else None
        if settled is not None and not barrier:
            return settled
        return Verdict("re-measure", f"{rounds} of {t.min_confirm_pairs} interleaved pairs"
                       + (f"; not settled early: {barrier}" if barrier else ""), cases=behind)
    confirmed = confirm(paired, t, ref.runs)
    keeps = confirmed.verdict == "keep" and own_spread
    spread = unstable(ref, t, paired, first or {}, prior, repeat_of, confirmed.rebaseline) if keeps else None
    if spread:
        if rounds < t.max_confirm_pairs:
            return Verdict("re-measure", f"{confirmed.tier}, but {spread}", decision=confirmed, cases=behind)
        return unstable_revert(confirmed, spread)
    if confirmed.tier == "no-change" and rounds < t.max_confirm_pairs:
        return Verdict("re-measure", "ambiguous after the interleaved pairs so far", decision=confirmed,
                       cases=behind)
    if confirmed.tier == "no-change":
        # "Within noise" never keeps code whose paired median sits beyond the case's gate: the kept
        # HEAD may not drift past the gate, however the statistics above came out.
        gates = {c: single_run_gate(case_noise(ref.noise, c, t), t) for c in cases}
        case = beyond_gate(ref, t, paired, confirmed.changes, gates)
        if case is not None:
            change = confirmed.changes[case]
            reason = (f"shape {case} {format_change(change)} vs the baseline commit, beyond its gate "
                      f"{gates[case] * 100:.1f} % (interleaved median ratio)")
            decision = replace(confirmed, verdict="revert", tier="regression", reason=reason, worst_shape=case)
            return Verdict("revert", reason, decision=decision)
    still = [c for c in cases if stats.median(paired[c][0]) / stats.median(paired[c][1]) > t.plausible_factor]
    review = bool(implausible) and confirmed.verdict == "keep"
    reason = confirmed.reason + (f"; re-measured: {', '.join(still) or 'no case'} still beyond "
                                 f"{t.plausible_factor:g}x, marked for review" if review else "")
    return Verdict(confirmed.verdict, reason, decision=confirmed, review=review)
