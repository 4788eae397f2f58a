"""The judge: everything an iteration measured goes in, one final verdict with its crash class comes out.

``judge(reference, thresholds, evidence)`` is pure and is the only place where measured facts become
a verdict. The loop calls it after each stage with the evidence gathered so far; a verdict that is
not ``final`` asks for more (``continue``: run the perf stage; ``re-measure``: one more interleaved
pair). Nothing after it overrides it: a fenced file edited while the tests ran, a record naming a
kernel the candidate does not define, a crashed re-check run are evidence fields, judged here.

Crash classes are decided in two places only: the child side (``child.runner.classify`` and the
integrity checks of ``child.measure``, which fill ``Stage.crash``) and this module.

Order: the work tree changed during the run -> correctness (positive evidence) -> the perf records
(complete, finite, plausible, of the candidate's own kernels) -> one run against the baseline
medians -> the interleaved re-check against the baseline *commit*, needed when the single run is
borderline or claims more than ``plausible_factor`` on some case. The re-check re-measures only the
cases the single run left in doubt (``rules.cases_in_doubt``, which says why the verdict stays
valid), unless the doubt is the geomean's; ``judge_partial`` combines them with the others.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cutile_perf.judge import stats
from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.paired import (SOME_RISE_Z, candidate_spread, completed, confirm, geomean_z,
                                      paired_log_ratios)
from cutile_perf.judge.rules import (Decision, Thresholds, baseline_disagreement, case_noise, cases_in_doubt, decide,
                                     geomean_zone, improvement_tier, single_run_gate)
from cutile_perf.templating import format_change


@dataclass(frozen=True)
class Stage:
    """What one pytest child showed: the one evidence type, filled by ``child.measure.run_stage``."""

    name: str = ""  # "correctness" or "perf"
    crash: CrashClass | None = None  # found by the child runner or the integrity checks
    duration_s: float = 0.0
    output: str = ""  # repo-relative path of the pytest output
    shapes: dict[str, float] = field(default_factory=dict)  # case -> median ms (perf only)
    test_ids: dict[str, str] = field(default_factory=dict)  # case -> pytest node id
    kernel_names: dict[str, str] = field(default_factory=dict)  # case -> kernel_name of its record, when given
    detail: str = ""
    ended: bool = True  # the plugin's end-of-session marker is there
    passed: frozenset = frozenset()
    not_passed: dict = field(default_factory=dict)  # test id -> outcome, for tests that did not pass
    restored: tuple[str, ...] = ()  # protected files put back after the child changed them
    sandbox: str = ""  # how the child was isolated: "unshare" (child/box.py) or "none: <why>"
    # The cases this run was asked to measure: an interleaved re-check run of the cases in doubt
    # (selected by node id); (): every case the perf command selects.
    cases: tuple[str, ...] = ()
    # The installed top-level modules a perf run's child imported (``child.warmstart.installed_imports``;
    # () for correctness): a baseline's perf runs teach the children started ahead of their turn what
    # to import while they wait.
    imports: tuple[str, ...] = ()
    # Checked timed calls (``child.checked``): a perf run's "checked" lines (what it captured), then,
    # once the reference child ran (``child.checkrun``), its "check" lines: the verdict per timed call.
    checked: tuple[dict, ...] = ()
    checks: tuple[dict, ...] = ()

    @property
    def ok(self) -> bool:
        return self.crash is None


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
class Evidence:
    """Everything one iteration measured so far."""

    correctness: Stage | None = None
    perf: Stage | None = None
    # Interleaved re-check: (baseline commit's run, candidate's run) per pair, in order; the last
    # pair's candidate is None while it runs (a crashed baseline run ends the iteration first).
    pairs: tuple[tuple[Stage, Stage | None], ...] = ()
    # Kernel names the candidate's fenced files define (None: not looked at; needed only when the
    # baseline's records named their kernels).
    defined_names: frozenset | None = None
    changed_during_run: bool = False  # the fenced files in the work tree differ from the candidate commit
    git_moved: str | None = None  # HEAD, the session branch or the index moved while the children ran
    # The iteration of an earlier row reverted with the same fenced content (``Iteration.repeat_of``):
    # trying it again until a lucky run keeps it must not work, so a repeat is kept only on the
    # whole interleaved re-check.
    repeat_of: int | None = None
    # What that content measured when it was reverted before (``loop.row.prior_ratios``): case ->
    # the candidate's ratios to the baseline, one per run. They are evidence of its spread: a fast
    # run now that disagrees with a slow one then is not kept (``earlier_runs_disagree``).
    prior_ratios: dict = field(default_factory=dict)

    def add(self, **changes) -> Evidence:
        return replace(self, **changes)

    def stages(self) -> list[Stage]:
        """Every stage that ran, in order."""
        runs = [run for pair in self.pairs for run in pair if run is not None]
        return [s for s in (self.correctness, self.perf) if s is not None] + runs


@dataclass(frozen=True)
class Verdict:
    action: str  # "keep", "revert", "crash", "continue" (run the next stage), "re-measure"
    reason: str = ""
    crash_class: CrashClass | None = None
    decision: Decision | None = None
    review: bool = False  # a claim beyond the plausibility factor: flagged for a human
    # "re-measure": the cases the next interleaved run measures (the cases in doubt); (): every case.
    cases: tuple[str, ...] = ()

    @property
    def final(self) -> bool:
        return self.action in ("keep", "revert", "crash")


def _crash(crash: CrashClass, reason: str, stage: Stage | None = None) -> Verdict:
    if stage is not None and stage.output and stage.output not in reason:
        reason = f"{reason} (see {stage.output})"
    return Verdict(crash.row_status, reason, crash_class=crash)


def stopped(exc: BaseException | None, reason: str | None = None) -> Verdict:
    """The verdict on an iteration that a signal, an exception or a kill stopped before its own verdict.
    Without ``reason``, the class and the exception say what stopped it."""
    interrupted = exc is None or isinstance(exc, KeyboardInterrupt)
    crash = CrashClass.INTERRUPTED if interrupted else CrashClass.ERROR
    if reason is None:
        reason = f"{crash.value}: {type(exc).__name__}: {exc}"
    return Verdict("crash", reason, crash_class=crash)


# The row's ``correctness`` when no verdict on the tests was reached: a kill or Ctrl-C stopped the
# iteration first. FAIL would accuse a change nothing found wrong; the row's crash
# class and reason say what stopped it.
NOT_RUN = "not run"


def correctness_status(verdict: Verdict, perf_ran: bool, seen: str | None = None) -> str:
    """The row's ``correctness`` field: FAIL when the correctness stage is what failed. An iteration
    that an interruption or the harness's own failure stopped before a verdict says what its
    correctness stage showed (``seen``: PASS or FAIL), ``NOT_RUN`` when that stage never ended:
    never FAIL for what the tests did not show."""
    if verdict.crash_class in (CrashClass.INTERRUPTED, CrashClass.HARNESS):
        return seen or NOT_RUN
    if verdict.crash_class is CrashClass.WRONG_RESULT:
        return "FAIL"
    failed_before_perf = verdict.crash_class in (CrashClass.COMPILE, CrashClass.FAULT, CrashClass.TIMEOUT,
                                                 CrashClass.NO_TESTS, CrashClass.INCOMPLETE_TESTS, CrashClass.ERROR)
    return "FAIL" if verdict.action == "crash" and failed_before_perf and not perf_ran else "PASS"


def judge_correctness(ev: Stage, ref: Reference) -> Verdict:
    """Correctness is positive evidence: tests ran, the baseline's passing tests pass again, the run ended."""
    if ev.crash:
        return _crash(ev.crash, f"correctness {ev.crash.value}: {ev.detail}", ev)
    if not ev.ended:
        return _crash(CrashClass.INCOMPLETE_TESTS, "correctness: the test session ended before the plugin's end "
                      "marker (exit during the run?)", ev)
    if not ev.passed:
        return _crash(CrashClass.INCOMPLETE_TESTS, "correctness: no test passed", ev)
    lost = sorted(ref.passed_tests - ev.passed)
    if lost:
        how = ev.not_passed.get(lost[0], "missing")
        return _crash(CrashClass.INCOMPLETE_TESTS, f"correctness: {len(lost)} test(s) that passed at the baseline "
                      f"did not pass now, e.g. {lost[0]} ({how})", ev)
    return Verdict("continue")


def judge_records(ev: Stage, ref: Reference, t: Thresholds) -> Verdict:
    """A perf run counts only with an end marker and a finite, plausible record for every baseline
    case it was asked to measure (``Stage.cases``; all of them when it names none)."""
    if ev.crash:
        return _crash(ev.crash, f"perf {ev.crash.value}: {ev.detail}", ev)
    if not ev.ended:
        return _crash(CrashClass.INCOMPLETE_TESTS, "perf: the test session ended before the plugin's end marker", ev)
    missing = sorted(set(ev.cases or ref.medians) - set(ev.shapes))
    if missing:
        return _crash(CrashClass.NO_RECORD, f"perf: no record for {len(missing)} baseline case(s), e.g. {missing[0]}",
                      ev)
    for case in sorted(ev.shapes):
        value = ev.shapes[case]
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= t.min_plausible_ms):
            return _crash(CrashClass.BAD_RECORD, f"perf: case {case} recorded median {value!r} ms (needs a finite "
                          f"time >= {t.min_plausible_ms:g} ms)", ev)
    return Verdict("continue")


def names_defined(kernel_name: str, defined) -> bool:
    """Whether a record's ``kernel_name`` (possibly decorated: ``name[...]``, ``name_<hash>``) is one of ``defined``."""
    return any(kernel_name == d or kernel_name.startswith(d + "[") or kernel_name.startswith(d + "_")
               or kernel_name.startswith(d + " ") for d in defined)


def judge_kernel_names(perf: Stage, ref: Reference, defined) -> Verdict:
    """Each case whose baseline record named its kernel must name one the candidate's fenced files define."""
    for case in sorted(ref.kernel_names):
        name = perf.kernel_names.get(case)
        if name is None or not names_defined(name, defined):
            return _crash(CrashClass.MEASURED_WRONG_CODE, f"perf measured-wrong-code: case {case} recorded kernel "
                          f"{name!r}, which the fenced files do not define (the measured kernel is not the "
                          "candidate's)", perf)
    return Verdict("continue")


def judge_checks(run: Stage, ref: Reference) -> Verdict:
    """Checked timed calls (``child.checked``, ``child.checkrun``): a timed call whose result differs
    from the baseline kernel's on the same inputs is ``wrong-when-timed``; a case whose record is
    below the floor its checked call gives (bytes over measured bandwidth) is ``implausible``.
    Both revert the change, naming the case and the call. Unchecked calls decide nothing here (the
    row and ``status`` say which and why)."""
    from cutile_perf.judge.floor import floor_verdict  # noqa: PLC0415

    for check in run.checks:
        if check.get("status") == "mismatch":
            return _crash(CrashClass.WRONG_WHEN_TIMED, f"perf wrong-when-timed: case {check.get('case')}, "
                          f"{check.get('timer', 'timer')} call {check.get('ordinal')}: {check.get('reason')}", run)
    for check in run.checks:
        case = check.get("case")
        if check.get("status") != "ok" or case not in run.shapes:
            continue
        why = floor_verdict(case, run.shapes[case], ref.medians.get(case), int(check.get("bytes") or 0),
                            check.get("gbps"))
        if why:
            return _crash(CrashClass.IMPLAUSIBLE, f"perf implausible: {why}", run)
    return Verdict("continue")


def implausible_cases(ref: Reference, medians: dict, t: Thresholds) -> list[str]:
    """Cases whose claimed speedup over the baseline exceeds the plausibility factor."""
    return sorted(c for c in ref.medians if c in medians and ref.medians[c] / medians[c] > t.plausible_factor)


def judge(ref: Reference, t: Thresholds, ev: Evidence) -> Verdict:
    """The verdict from whatever evidence exists so far; ``continue``/``re-measure`` ask for more."""
    if ev.git_moved:
        # Git is the harness's alone: a branch or HEAD moved by anything else is not what was measured.
        return Verdict("crash", f"tampered: {ev.git_moved} while the tests ran", crash_class=CrashClass.TAMPERED)
    if ev.changed_during_run:
        # An edit made while pytest ran is not what was measured: never keep it.
        return Verdict("crash", "the fenced files changed while the tests ran; the latest version is in the patch",
                       crash_class=CrashClass.CHANGED_DURING_RUN)
    if ev.correctness is not None:
        verdict = judge_correctness(ev.correctness, ref)
        if verdict.final:
            return verdict
    if ev.perf is None:
        return Verdict("continue")
    if ev.perf.ok and ref.kernel_names and ev.defined_names is not None:
        verdict = judge_kernel_names(ev.perf, ref, ev.defined_names)
        if verdict.final:
            return verdict
    verdict = judge_records(ev.perf, ref, t)
    if verdict.final:
        return verdict
    verdict = judge_checks(ev.perf, ref)
    if verdict.final:
        return verdict
    perf = ev.perf.shapes
    cases = sorted(ref.medians)
    implausible = implausible_cases(ref, perf, t)
    single_medians = {c: perf[c] for c in cases}
    doubt = cases_in_doubt(ref.medians, single_medians, ref.noise, t, implausible)
    if not ev.pairs:
        single = decide({c: ref.medians[c] for c in cases}, single_medians, ref.noise, t)
        # One candidate process says nothing about the candidate's own spread: a keep that moves the
        # reference, or keeps content reverted before, rests on interleaved pairs too.
        unproven = single.verdict == "keep" and (single.rebaseline or ev.repeat_of is not None)
        if single.verdict == "confirm" or (implausible and single.verdict == "keep") or unproven:
            if implausible:
                why = f"claims more than {t.plausible_factor:g}x on {', '.join(implausible)}"
            elif single.verdict == "keep" and ev.repeat_of is not None:
                why = (f"{single.reason}; the same fenced content was reverted at iteration {ev.repeat_of}, so "
                       "only the whole interleaved re-check may keep it")
            elif single.verdict == "keep":
                why = f"{single.reason}; a keep that moves the baseline rests on more than one candidate run"
            else:
                why = single.reason
            if len(doubt) < len(cases):
                why += f"; re-measuring the {len(doubt)} of {len(cases)} cases in doubt ({_names(doubt)})"
            return Verdict("re-measure", why, decision=single, cases=_asked(doubt, cases))
        return Verdict(single.verdict, single.reason, decision=single)
    for pair in ev.pairs:
        for run in pair:
            check = judge_records(run, ref, t) if run is not None else Verdict("continue")
            if not check.final and run is not None:
                check = judge_checks(run, ref)
            if check.final:  # a crash of a re-check run is the iteration's crash
                return replace(check, reason=f"interleaved re-check: {check.reason}")
    if ev.pairs[-1][1] is None:
        return Verdict("re-measure", "the candidate's run of this interleaved pair is next",
                       cases=ev.pairs[-1][0].cases)
    drifted = drifted_pairs(ref, t, ev.pairs)
    if drifted:
        return judge_without_drifted(ref, t, ev, drifted)
    paired = paired_samples(ev.pairs, cases)
    first = {c: single_medians[c] / ref.medians[c] for c in cases}
    if len(doubt) < len(cases):
        verdict = judge_partial(ref, t, single_medians, doubt, paired, implausible, ev.repeat_of,
                                prior=ev.prior_ratios)
        if verdict is not None:
            return verdict
    return judge_paired(ref, t, paired, implausible, first=first, repeat_of=ev.repeat_of, prior=ev.prior_ratios)


# A re-check whose baseline runs disagree with the recorded baseline (``drifted_pairs``) runs up to
# this many pairs beyond ``max_confirm_pairs`` in their place before it refuses to decide.
DRIFT_EXTRA_PAIRS = 2


def last_pair(t: Thresholds) -> int:
    """The most interleaved pairs one re-check may run: ``max_confirm_pairs``, plus the pairs that
    replace those whose baseline run drifted."""
    return t.max_confirm_pairs + DRIFT_EXTRA_PAIRS


def drifted_pairs(ref: Reference, t: Thresholds, pairs) -> dict[int, str]:
    """Index -> why, of each complete pair whose baseline run disagrees with the baseline's recorded
    medians (``rules.baseline_disagreement``, over the cases the run measured). Such a pair compares
    the candidate with a baseline that did not run at its recorded speed: a co-tenant or a reverted
    iteration's leftover slowing the one baseline run of a pair made an honestly slower change
    "-36.9 %, settled after 1 pair" before this check (issue 39)."""
    out = {}
    for index, (base, cand) in enumerate(pairs):
        if cand is None or not (base.ok and cand.ok):
            continue
        asked = [c for c in (base.cases or ref.medians) if c in base.shapes and c in ref.medians]
        why = baseline_disagreement(ref.medians, ref.noise, {c: base.shapes[c] for c in asked}, t)
        if why:
            out[index] = why
    return out


def judge_without_drifted(ref: Reference, t: Thresholds, ev: Evidence, drifted: dict[int, str]) -> Verdict:
    """The verdict on the pairs whose baseline run agrees with the recorded baseline: the others are
    left out (chosen on the baseline runs alone, so the candidate's runs bias nothing), and more pairs
    are run in their place up to ``last_pair``. Past it, no verdict can rest on this re-check: the
    change is refused as "baseline-drift", never kept on a baseline that ran at another speed."""
    first = min(drifted)
    note = (f"pair {first + 1}'s baseline run left out: {drifted[first]}"
            + (f" ({len(drifted)} of {len(ev.pairs)} pairs left out)" if len(drifted) > 1 else ""))
    verdict = judge(ref, t, replace(ev, pairs=tuple(p for i, p in enumerate(ev.pairs) if i not in drifted)))
    if verdict.final:
        reason = f"{verdict.reason}; {note}"
        decision = replace(verdict.decision, reason=reason) if verdict.decision is not None else None
        return replace(verdict, reason=reason, decision=decision)
    if len(ev.pairs) < last_pair(t):
        return replace(verdict, reason=f"{note}; re-measuring")
    reason = (f"baseline-drift: {len(drifted)} of {len(ev.pairs)} interleaved pairs' baseline runs disagreed with "
              f"the baseline's recorded medians (e.g. {drifted[first]}): the machine or a leftover changed the "
              "baseline's speed, so no verdict rests on them; try again on a quiet device")
    return Verdict("revert", reason, decision=Decision("revert", "baseline-drift", reason, source="confirm"))


def _names(cases, shown: int = 3) -> str:
    return ", ".join(cases[:shown]) + (f" and {len(cases) - shown} more" if len(cases) > shown else "")


def _asked(cases, every) -> tuple[str, ...]:
    """``Verdict.cases`` for a re-measure of ``cases``: () when that is every case (no selection)."""
    return () if set(cases) >= set(every) else tuple(cases)


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
    for case in sorted(measured):
        if changes.get(case, 0.0) > gates[case] and max(tests[case].z, tests[case].robust_z) > SOME_RISE_Z:
            return case
    return None


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
    note = (f"{len(doubt)} of {len(cases)} cases re-measured interleaved ({_names(doubt)}), the others as the "
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
    behind = _asked([c for c in cases if per_case[c] == rounds], cases)
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
