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
from dataclasses import replace

from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.evidence import (NOT_RUN, Evidence, Reference, Stage, Verdict, asked_cases, case_names,
                                        correctness_status, crash_verdict, stopped)
from cutile_perf.judge.recheck import judge_paired, judge_partial, paired_samples
from cutile_perf.judge.rules import Decision, Thresholds, baseline_disagreement, cases_in_doubt, decide

# The evidence types are read from here by most callers: the judge's inputs and outputs in one import.
__all__ = ["NOT_RUN", "Evidence", "Reference", "Stage", "Verdict", "correctness_status", "judge", "judge_checks",
           "judge_correctness", "judge_timed_run", "judge_kernel_names", "judge_records", "implausible_cases", "last_pair",
           "names_defined", "paired_samples", "stopped", "crash_verdict"]


def judge_correctness(ev: Stage, ref: Reference) -> Verdict:
    """Correctness is positive evidence: tests ran, the baseline's passing tests pass again, the run ended."""
    if ev.crash:
        return crash_verdict(ev.crash, f"correctness {ev.crash.value}: {ev.detail}", ev)
    if not ev.ended:
        return crash_verdict(CrashClass.INCOMPLETE_TESTS, "correctness: the test session ended before the plugin's end "
                      "marker (exit during the run?)", ev)
    if not ev.passed:
        return crash_verdict(CrashClass.INCOMPLETE_TESTS, "correctness: no test passed", ev)
    lost = sorted(ref.passed_tests - ev.passed)
    if lost:
        how = ev.not_passed.get(lost[0], "missing")
        return crash_verdict(CrashClass.INCOMPLETE_TESTS, f"correctness: {len(lost)} test(s) that passed at the baseline "
                      f"did not pass now, e.g. {lost[0]} ({how})", ev)
    return Verdict("continue")


def judge_records(ev: Stage, ref: Reference, t: Thresholds) -> Verdict:
    """A perf run counts only with an end marker and a finite, plausible record for every baseline
    case it was asked to measure (``Stage.cases``; all of them when it names none)."""
    if ev.crash:
        return crash_verdict(ev.crash, f"perf {ev.crash.value}: {ev.detail}", ev)
    if not ev.ended:
        return crash_verdict(CrashClass.INCOMPLETE_TESTS, "perf: the test session ended before the plugin's end marker", ev)
    missing = sorted(set(ev.cases or ref.medians) - set(ev.shapes))
    if missing:
        return crash_verdict(CrashClass.NO_RECORD, f"perf: no record for {len(missing)} baseline case(s), e.g. {missing[0]}",
                      ev)
    for case in sorted(ev.shapes):
        value = ev.shapes[case]
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= t.min_plausible_ms):
            return crash_verdict(CrashClass.BAD_RECORD, f"perf: case {case} recorded median {value!r} ms (needs a finite "
                          f"time >= {t.min_plausible_ms:g} ms)", ev)
    return Verdict("continue")


def names_defined(kernel_name: str, defined) -> bool:
    """Whether a record's ``kernel_name`` (possibly decorated: ``name[...]``, ``name_<hash>``) is one of ``defined``."""
    return any(kernel_name == d or kernel_name.startswith((d + "[", d + "_", d + " ")) for d in defined)


def judge_kernel_names(perf: Stage, ref: Reference, defined) -> Verdict:
    """Each case whose baseline record named its kernel must name one the candidate's fenced files define."""
    for case in sorted(ref.kernel_names):
        name = perf.kernel_names.get(case)
        if name is None or not names_defined(name, defined):
            return crash_verdict(CrashClass.MEASURED_WRONG_CODE, f"perf measured-wrong-code: case {case} recorded kernel "
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
            return crash_verdict(CrashClass.WRONG_WHEN_TIMED, f"perf wrong-when-timed: case {check.get('case')}, "
                          f"{check.get('timer', 'timer')} call {check.get('ordinal')}: {check.get('reason')}", run)
    for check in run.checks:
        case = check.get("case")
        if check.get("status") != "ok" or case not in run.shapes:
            continue
        why = floor_verdict(case, run.shapes[case], ref.medians.get(case), int(check.get("bytes") or 0),
                            check.get("gbps"))
        if why:
            return crash_verdict(CrashClass.IMPLAUSIBLE, f"perf implausible: {why}", run)
    return Verdict("continue")


def implausible_cases(ref: Reference, medians: dict, t: Thresholds) -> list[str]:
    """Cases whose claimed speedup over the baseline exceeds the plausibility factor."""
    return sorted(c for c in ref.medians if c in medians and ref.medians[c] / medians[c] > t.plausible_factor)


def judge_timed_run(run: Stage, ref: Reference, t: Thresholds, defined_names=None) -> Verdict:
    """Whether a candidate's timed run counts at all ("continue"), or the crash that voids it: its
    records name kernels its fenced files define (when ``defined_names`` were looked at), are
    complete and plausible for the cases it was asked for, and its checked timed calls agree."""
    if run.ok and ref.kernel_names and defined_names is not None:
        verdict = judge_kernel_names(run, ref, defined_names)
        if verdict.final:
            return verdict
    verdict = judge_records(run, ref, t)
    return verdict if verdict.final else judge_checks(run, ref)


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
    verdict = judge_timed_run(ev.perf, ref, t, ev.defined_names)
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
                why += f"; re-measuring the {len(doubt)} of {len(cases)} cases in doubt ({case_names(doubt)})"
            return Verdict("re-measure", why, decision=single, cases=asked_cases(doubt, cases))
        return Verdict(single.verdict, single.reason, decision=single)
    for pair in ev.pairs:
        for run in (run for run in pair if run is not None):
            check = judge_timed_run(run, ref, t)
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
