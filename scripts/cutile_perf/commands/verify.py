"""``cutile-perf verify [--from A --to B]``: does the recorded speedup reproduce from git alone?

Re-runs correctness on B and re-measures A and B interleaved (A, B, A, B, ...) in pristine
checkouts of the two commits, then compares the measured geomean ratio B/A, with its bootstrap
interval, to the one the log recorded. The log is read only to know what was claimed: what runs
comes from the commits, whatever the work tree holds.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cutile_perf import templating
from cutile_perf.child import envcheck, measure
from cutile_perf.errors import EXIT_OK, EXIT_REJECTED, Refused, UsageError
from cutile_perf.judge import paired, stats
from cutile_perf.judge.verdict import Reference, judge_correctness, judge_records
from cutile_perf.loop import iteration, offbranch
from cutile_perf.store.history import History
from cutile_perf.loop.stages import StageRunner
from cutile_perf.output import Outcome, say
from cutile_perf.store import git_ops
from cutile_perf.store import session as session_mod


def verify(*, repo: Path, older: str | None, newer: str | None, pairs: int, full_tests: bool = False) -> Outcome:
    if pairs < paired.MIN_CONFIRM_SAMPLES:
        raise UsageError(f"--pairs must be at least {paired.MIN_CONFIRM_SAMPLES}")
    clock = iteration.Clock()
    probe = envcheck.Probe()
    session = session_mod.load(repo)
    iteration.require_gpu(session, probe)
    with session_mod.locked(session.repo, "verify"):
        g = git_ops.open_repo(session.repo)
        history = History.open(session, g)
        if history.baseline() is None:
            raise Refused("no baseline recorded yet", "run `cutile-perf baseline` first")
        iteration.require_baseline_env(history)
        try:
            a = git_ops.resolve(g, older or history.first()["commit"])
            b = git_ops.resolve(g, newer or history.kept_commit(session.base_commit))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        offbranch.refuse_kept_commits_off_branch(session, g, history, (a, b))  # amended or rebased away: exit 3
        claim, cases = history.claimed_ratio(a, b)
        if claim is None:
            # A commit the log never kept (a rewritten or hand-made one) carries no claim to check.
            return Outcome(f"NOT VERIFIED: the log records no kept row for {git_ops.short(g, a)} and "
                           f"{git_ops.short(g, b)} (a commit rewritten after the loop kept it has another sha); "
                           "`cutile-perf status` lists the kept commits", {"verified": False, "from": a, "to": b},
                           EXIT_REJECTED)
        # The kept commits hold only fenced changes: the measurement composes unfenced paths from the
        # base commit, so an unfenced change smuggled into a kept commit (a moved branch) would
        # otherwise never be looked at.
        unfenced = [p for p in git_ops.changed_between(g, session.base_commit, b) if not session.in_fence(p)]
        if unfenced:
            return Outcome(f"NOT VERIFIED: {git_ops.short(g, b)} changes paths outside the fence since the session's "
                           f"base ({', '.join(unfenced[:5])}); the loop never keeps such a commit",
                           {"verified": False, "from": a, "to": b, "unfenced": unfenced}, EXIT_REJECTED)
        reference = history.reference()
        tag = f"verify-{git_ops.short(g, a)}-{git_ops.short(g, b)}"
        # --full-tests: the session may have narrowed its correctness command before the baseline
        # (Session.edited_commands); a kept row was then checked against fewer tests than init chose.
        corr_session = replace(session, correctness_cmd=session_mod.CORRECTNESS_TEMPLATE) if full_tests else session
        which = "init's correctness selection" if full_tests else "correctness"
        stages = 2 if full_tests else 1
        # A fresh compile cache: verify trusts nothing but the commits, not even the session's
        # guarded cache (jitcache.py, "What the guard does not stop").
        with StageRunner(session, g, measure.Deadline(session.timeout_s * (pairs + stages)), clock,
                         fresh_compile_cache=True) as runner:
            say(f"{which} of {git_ops.short(g, b)}")
            corr = runner.stage("correctness", tag, b, session=corr_session)
            checked = judge_correctness(corr, reference)
            if checked.final:
                data = {"verified": False, "correctness": checked.reason, "full_tests": full_tests}
                also = ""
                if full_tests:  # new with this change, or already failing before it?
                    say(f"{which} of {git_ops.short(g, a)}")
                    before = runner.stage("correctness", f"{tag}-from", a, session=corr_session)
                    data["fails_on_from_too"] = judge_correctness(before, reference).final
                    also = (f"; it fails on {git_ops.short(g, a)} too, so the change did not bring it"
                            if data["fails_on_from_too"] else f"; {git_ops.short(g, a)} passes it")
                return Outcome(f"NOT VERIFIED: {git_ops.short(g, b)} fails {which}: {checked.reason}{also}",
                               data, EXIT_REJECTED)
            ran = [corr]
            samples = {c: ([], []) for c in cases}
            for k in range(pairs):
                for side, commit in ((0, a), (1, b)):
                    say(f"pair {k + 1}/{pairs}: perf of {git_ops.short(g, commit)}")
                    run = runner.stage("perf", f"{tag}-{k + 1}-{'from' if side == 0 else 'to'}", commit)
                    ran.append(run)
                    check = judge_records(run, Reference(commit, {c: 1.0 for c in cases}, {}), session.thresholds)
                    if check.final:
                        return Outcome(f"NOT VERIFIED: a perf run crashed: {check.reason}",
                                       {"verified": False, "crash": check.reason}, EXIT_REJECTED)
                    for c in cases:
                        samples[c][side].append(run.shapes[c])
    base_agg = [stats.geomean([samples[c][0][i] for c in cases]) for i in range(pairs)]
    cand_agg = [stats.geomean([samples[c][1][i] for c in cases]) for i in range(pairs)]
    ratio, low, high = stats.ratio_ci(base_agg, cand_agg, confidence=session.thresholds.confidence)
    gate = max(session.thresholds.min_noise, stats.relative_spread(base_agg))
    reproduces = low - gate <= claim <= high + gate
    per_case = {c: stats.median(samples[c][1]) / stats.median(samples[c][0]) for c in cases}
    word = "VERIFIED" if reproduces else "NOT VERIFIED"
    # Independent only when the candidate's code could not reach the measurement: every child boxed.
    boxed = iteration.isolation(ran)
    if boxed != "unshare":
        word += f" (not independent: the children ran without a sandbox, {boxed})"
    text = (f"{word}: {git_ops.short(g, a)} -> {git_ops.short(g, b)} recorded {templating.format_change(claim - 1)}, "
            f"measured {templating.format_change(ratio - 1)} (interval {templating.format_change(low - 1)} to "
            f"{templating.format_change(high - 1)}, gate {gate * 100:.1f} %, {pairs} interleaved pairs); {which} passed")
    lines = [text, "", "| case | from (ms) | to (ms) | change |", "|---|---|---|---|"]
    lines += [f"| {c} | {stats.median(samples[c][0]):.6f} | {stats.median(samples[c][1]):.6f} | "
              f"{templating.format_change(per_case[c] - 1)} |" for c in cases]
    data = {"verified": reproduces, "from": a, "to": b, "claimed_ratio": claim, "measured_ratio": ratio,
            "interval": [low, high], "gate": gate, "per_case": per_case, "pairs": pairs, "full_tests": full_tests,
            "sandbox": boxed, "independent": boxed == "unshare"}
    return Outcome("\n".join(lines), data, EXIT_OK if reproduces else EXIT_REJECTED)
