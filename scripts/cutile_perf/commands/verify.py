"""``cutile-perf verify [--from A --to B]``: does the verdict the log kept B on reproduce from git alone?

B is judged against A the way ``try`` judged it against its baseline, by the loop's own judge
(``judge.verdict.judge``, no second rule): correctness of B, one perf run of B against A's recorded
medians, then A and B interleaved (A, B, A, B, ...) until the judge's verdict is final, at least
``--pairs`` pairs. Every run is a fresh child in a pristine checkout of its commit, compiling in an
empty cache of its own, so the judge's evidence checks all apply as in the loop: checked timed
calls, the baseline cross-check (A's runs against A's recorded medians), complete and plausible
records of the candidate's own kernels.

The verdict's geomean and tier are then compared with what the log kept B on (``claimed``), and
the output names each part it could not reproduce. The log is read only to know what was claimed:
what runs comes from the commits, whatever the work tree holds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from cutile_perf import templating
from cutile_perf.child import checkrun, measure
from cutile_perf.errors import EXIT_OK, EXIT_REJECTED, UsageError
from cutile_perf.judge import paired, stats
from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.rules import IMPROVING_TIERS, Thresholds, geomean_zone, improvement_tier, moved_performance
from cutile_perf.judge.verdict import (Evidence, Reference, Verdict, judge, judge_correctness, last_pair,
                                       paired_samples)
from cutile_perf.loop import guards, offbranch, row as row_mod
from cutile_perf.store.history import History
from cutile_perf.loop.stages import StageRunner, Stages
from cutile_perf.output import Outcome, say
from cutile_perf.store import git_ops
from cutile_perf.store import session as session_mod
from cutile_perf.store.log import shape_medians


@dataclass(frozen=True)
class Claim:
    """What the log kept B on, seen from A: the geomean latency ratio B/A of the verdicts in between
    and the tier they add up to (None when a row in between claims no tier: an adopted commit)."""

    ratio: float
    tier: str | None
    iterations: tuple[int, ...]  # the kept rows after A up to B

    def to_dict(self) -> dict:
        return {"geomean_change": self.ratio - 1.0, "tier": self.tier, "iterations": list(self.iterations)}


def kept_index(rows: list[dict], commit: str) -> int | None:
    """The index of the last kept row of ``commit`` (the baseline row included), or None."""
    found = [i for i, row in enumerate(rows) if row.get("status") == "keep" and row.get("commit") == commit]
    return found[-1] if found else None


def claimed(rows: list[dict], older: int, newer: int, t: Thresholds) -> Claim:
    """The claim of rows ``older`` < ``newer`` (kept rows' indices). Each row that moved performance
    claims its verdict's geomean against the reference before it; a "no-change" keep claims none.
    The ratios multiply along the chain. One such row: its own tier; several: the tier of their
    product; none: "no-change"."""
    prior = shape_medians(rows[0])
    for row in rows[1:older + 1]:
        if moved_performance(row):
            prior = shape_medians(row)
    ratio, tiers = 1.0, []
    for row in rows[older + 1:newer + 1]:
        if not moved_performance(row):
            continue
        decision = row.get("decision") or {}
        change = decision.get("geomean_change")
        medians = shape_medians(row)
        if change is None:  # a row logged without its verdict's geomean: its medians against the reference's
            cases = sorted(set(prior) & set(medians))
            change = stats.geomean([medians[c] / prior[c] for c in cases]) - 1.0
        ratio *= 1.0 + change
        tiers.append(decision.get("tier"))
        prior = medians
    if not tiers:
        tier = "no-change"
    elif any(tier not in IMPROVING_TIERS for tier in tiers):
        tier = None  # an adopted commit was measured, not judged: only its geomean is a claim
    else:
        tier = tiers[0] if len(tiers) == 1 else improvement_tier(1.0 - ratio, t)
    iterations = tuple(row.get("iteration") for row in rows[older + 1:newer + 1] if row.get("status") == "keep")
    return Claim(ratio, tier, iterations)


def reference_for(history: History, older: int, commit: str) -> Reference:
    """A as the judge's reference: the medians, noise and passing tests in force once A was kept,
    exactly what a try right after A was judged against."""
    before = History(history.rows[:older + 1], session=history.session, g=history.g)
    return replace(before.reference(), commit=commit)


def verify_thresholds(t: Thresholds, pairs: int) -> Thresholds:
    """The session's rules, with at least ``pairs`` interleaved pairs and none skipped: verify is run
    to check, so the pairs are not cut short once the verdict looks settled."""
    return replace(t, min_confirm_pairs=max(pairs, t.min_confirm_pairs),
                   max_confirm_pairs=max(pairs, t.max_confirm_pairs), settle_sd=0.0)


def rejudge(stages: Stages, ref: Reference, t: Thresholds, older: str, newer: str, tag: str,
            corr_session=None) -> tuple[Evidence, Verdict]:
    """Run what the judge asks for until its verdict is final, as ``Iteration.measure`` does, except
    that the interleaved pairs always run (a single run is no reproduction)."""
    extra = {"session": corr_session} if corr_session is not None else {}  # --full-tests
    evidence = Evidence(correctness=stages.stage("correctness", tag, newer, **extra))
    verdict = judge(ref, t, evidence)
    if verdict.final:
        return evidence, verdict
    single = stages.stage("perf", f"{tag}-single", newer)
    defined = frozenset(stages.defined_names(newer)) if ref.kernel_names and single.ok else None
    evidence = evidence.add(perf=single, defined_names=defined)
    verdict = judge(ref, t, evidence)
    while verdict.action != "crash" and (not evidence.pairs or verdict.action == "re-measure"):
        k = len(evidence.pairs) + 1
        if k > last_pair(t):
            break
        say(f"pair {k}: perf of {older[:12]} (from), then {newer[:12]} (to)")
        base = stages.stage("perf", f"{tag}-{k}-from", older)
        evidence = evidence.add(pairs=(*evidence.pairs, (base, None)))
        verdict = judge(ref, t, evidence)
        if verdict.final:
            break
        cand = stages.stage("perf", f"{tag}-{k}-to", newer)
        evidence = evidence.add(pairs=(*evidence.pairs[:-1], (base, cand)))
        verdict = judge(ref, t, evidence)
    return evidence, verdict


# What the judge's verdict says about each part of the claim, by the crash class that ended it.
CHECKED_CLASSES = (CrashClass.WRONG_WHEN_TIMED, CrashClass.IMPLAUSIBLE)


def not_reproduced(claim: Claim, evidence: Evidence, verdict: Verdict, gate: float) -> dict[str, str]:
    """Each part of the claim the re-judged verdict does not reproduce, with why; {} when it does.

    Parts: correctness, checked timed calls, the perf runs, the baseline cross-check (A did not run
    at its recorded speed, so nothing rests on the pairs), the tier, and the geomean (beyond the
    judge's noise gate for the geomean, ``rules.geomean_zone``, of the claimed one)."""
    if not verdict.final:
        return {"verdict": f"no verdict after {len(evidence.pairs)} pairs: {verdict.reason}"}
    if evidence.perf is None and verdict.crash_class is not None:
        failed = sorted((evidence.correctness.not_passed if evidence.correctness is not None else {}) or {})
        named = f" (not passed: {', '.join(failed[:5])})" if failed else ""  # the reason may name no test
        return {"correctness": verdict.reason + named}
    if verdict.crash_class in CHECKED_CLASSES:
        return {"checked timed calls": verdict.reason}
    if verdict.crash_class is not None:
        return {"perf runs": verdict.reason}
    decision = verdict.decision
    if decision is not None and decision.tier == "baseline-drift":
        return {"baseline cross-check": verdict.reason}
    out = {}
    tier = decision.tier if decision is not None else verdict.action
    if claim.tier is not None and tier != claim.tier:
        out["tier"] = f"recorded {claim.tier}, re-judged {tier}"
    measured = decision.geomean_change if decision is not None else None
    if measured is None:
        out["geomean"] = "the verdict carries no geomean"
    elif abs((1.0 + measured) / claim.ratio - 1.0) > gate:
        out["geomean"] = (f"recorded {templating.format_change(claim.ratio - 1)}, re-judged "
                          f"{templating.format_change(measured)}, apart by more than the gate {gate * 100:.1f} %")
    return out


def verify(*, repo: Path, older: str | None, newer: str | None, pairs: int, full_tests: bool = False,
           stages: Stages | None = None) -> Outcome:
    """``stages``: what runs the tests (default: pytest children in pristine checkouts compiling in an
    empty cache, ``StageRunner``); tests pass a ``ScriptedStages``."""
    if pairs < paired.MIN_CONFIRM_SAMPLES:
        raise UsageError(f"--pairs must be at least {paired.MIN_CONFIRM_SAMPLES}")
    clock = row_mod.Clock()
    with guards.measuring(repo, "verify") as (session, g, history):
        try:
            a = git_ops.resolve(g, older or history.first()["commit"])
            b = git_ops.resolve(g, newer or history.kept_commit())
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        offbranch.refuse_kept_commits_off_branch(session, g, history, (a, b))  # amended or rebased away: exit 3
        first, last = kept_index(history.rows, a), kept_index(history.rows, b)
        if first is None or last is None:
            # A commit the log never kept (a rewritten or hand-made one) carries no claim to check.
            return Outcome(f"NOT VERIFIED: the log records no kept row for {git_ops.short(g, a)} and "
                           f"{git_ops.short(g, b)} (a commit rewritten after the loop kept it has another sha); "
                           "`cutile-perf status` lists the kept commits", {"verified": False, "from": a, "to": b},
                           EXIT_REJECTED)
        if first >= last:
            raise UsageError(f"--from {git_ops.short(g, a)} must be a kept commit older than --to {git_ops.short(g, b)}")
        # The kept commits hold only fenced changes: the measurement composes unfenced paths from the
        # base commit, so an unfenced change smuggled into a kept commit (a moved branch) would
        # otherwise never be looked at.
        unfenced = guards.unfenced_since_base(session, g, b)
        if unfenced:
            return Outcome(f"NOT VERIFIED: {git_ops.short(g, b)} changes paths outside the fence since the session's "
                           f"base ({', '.join(unfenced[:5])}); the loop never keeps such a commit",
                           {"verified": False, "from": a, "to": b, "unfenced": unfenced}, EXIT_REJECTED)
        t = verify_thresholds(session.thresholds, pairs)
        claim = claimed(history.rows, first, last, t)
        ref = reference_for(history, first, a)
        tag = f"verify-{git_ops.short(g, a)}-{git_ops.short(g, b)}"
        # --full-tests: the session may have narrowed its correctness command before the baseline
        # (Session.edited_commands); a kept row was then checked against fewer tests than init chose.
        corr_session = replace(session, correctness_cmd=session_mod.CORRECTNESS_TEMPLATE) if full_tests else None
        children = (2 if full_tests else 1) + 1 + 2 * last_pair(t)
        # A fresh compile cache: verify trusts nothing but the commits, not even the session's
        # guarded cache (jitcache.py, "What the guard does not stop").
        runner = stages if stages is not None else StageRunner(
            session, g, measure.Deadline(session.timeout_s * children), clock, fresh_compile_cache=True)
        with runner:
            evidence, verdict = rejudge(runner, ref, t, a, b, tag, corr_session)
            if full_tests and evidence.perf is None and verdict.final:  # new with this change, or failing before it?
                before = runner.stage("correctness", f"{tag}-from", a, session=corr_session)
                fails_before = judge_correctness(before, ref).final
            else:
                fails_before = None
    gate = geomean_zone({c: 1.0 for c in ref.medians}, ref.noise, t)[2]
    missed = not_reproduced(claim, evidence, verdict, gate)
    return outcome(g, a, b, claim, evidence, verdict, missed, gate, full_tests=full_tests, fails_before=fails_before)


def outcome(g, a: str, b: str, claim: Claim, evidence: Evidence, verdict: Verdict, missed: dict[str, str],
            gate: float, *, full_tests: bool, fails_before: bool | None) -> Outcome:
    """The one line (and per-case table) and the JSON of a verification."""
    decision = verdict.decision
    measured = {"action": verdict.action, "tier": decision.tier if decision is not None else None,
                "geomean_change": decision.geomean_change if decision is not None else None,
                "crash_class": verdict.crash_class.value if verdict.crash_class else None, "reason": verdict.reason}
    # Independent only when the candidate's code could not reach the measurement: every child boxed.
    boxed = row_mod.isolation(evidence.stages())
    data = {"verified": not missed, "from": a, "to": b, "recorded": claim.to_dict(), "measured": measured,
            "not_reproduced": missed, "gate": gate, "pairs": len(evidence.pairs), "full_tests": full_tests,
            "sandbox": boxed, "independent": boxed == "unshare",
            **checkrun.row_fields([evidence.perf, *(run for pair in evidence.pairs for run in pair)])}
    if "correctness" in missed:
        data["correctness"] = missed["correctness"]
        if fails_before is not None:
            data["fails_on_from_too"] = fails_before
    word = "VERIFIED" if not missed else "NOT VERIFIED"
    if boxed != "unshare":
        word += f" (not independent: the children ran without a sandbox, {boxed})"
    short_a, short_b = git_ops.short(g, a), git_ops.short(g, b)
    kept_on = f"{claim.tier or 'adopted'} {templating.format_change(claim.ratio - 1)}"
    judged = (f"{measured['tier'] or measured['action']} {templating.format_change(measured['geomean_change'])}"
              if measured["geomean_change"] is not None else verdict.action)
    text = f"{word}: {short_a} -> {short_b} kept as {kept_on}, re-judged {judged} (geomean gate {gate * 100:.1f} %)"
    if missed:
        text += "; could not reproduce: " + "; ".join(f"{part} ({why})" for part, why in missed.items())
        if fails_before is not None:
            text += (f"; it fails on {short_a} too, so the change did not bring it" if fails_before
                     else f"; {short_a} passes it")
    if data.get("checked"):
        text += f"; {data['checked']}"
    lines = [text] + ([] if verdict.reason in text else [f"judge: {verdict.reason}"])
    samples = {c: s for c, s in paired_samples(evidence.pairs, sorted(evidence.perf.shapes)).items() if s[0]} \
        if evidence.perf is not None and evidence.perf.ok else {}
    if samples:
        lines += ["", "| case | from (ms) | to (ms) | change |", "|---|---|---|---|"]
        lines += [f"| {c} | {stats.median(base):.6f} | {stats.median(cand):.6f} | "
                  f"{templating.format_change(stats.median(cand) / stats.median(base) - 1)} |"
                  for c, (base, cand) in samples.items()]
    return Outcome("\n".join(lines), data, EXIT_OK if not missed else EXIT_REJECTED)
