"""``cutile-perf try "<optimization>"``: one change, committed first, measured exactly as committed.

Order: checks (log chain, frozen session, branch, fence, regular files, no git filter) -> patch
saved -> candidate commit -> correctness, perf and any interleaved re-check, each in a throw-away
checkout built from the commits (``pristine``) -> ``decide.judge`` -> row appended -> settled (kept:
HEAD stays on the candidate, with trailers; otherwise ``txn.revert_to_base``). Each step is
persisted (``txn``), so an interruption anywhere ends in one consistent state via ``resume``.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from cutile_perf.judge import decide
from cutile_perf.child import envcheck, measure
from cutile_perf.store import git_ops
from cutile_perf.loop import iteration, txn
from cutile_perf.store import session as session_mod
from cutile_perf.output import Outcome, say
from cutile_perf.judge.crash import CrashClass
from cutile_perf.errors import (EXIT_CRASH, EXIT_OK, EXIT_REJECTED, FenceViolation, IterationCrashed, NoChange,
                                Refused, UsageError)
from cutile_perf.store import log

TRAILER = "Cutile-Perf"


def _outside_fence_ignorable(path: str) -> bool:
    """Untracked files no stage can ever see: bytecode caches never enter a pristine checkout."""
    return "__pycache__/" in path or path.endswith((".pyc", ".pyo"))


def candidate_paths(session: session_mod.Session, g) -> list[str]:
    """The fenced paths this iteration changes, or the refusal that says why it cannot run."""
    from cutile_perf.commands.install_skill import is_installed_skill_path  # noqa: PLC0415 - TODO(core)

    changed = [p for p in git_ops.changed_paths(g) if not _outside_fence_ignorable(p)
               and not is_installed_skill_path(p)]
    outside = [p for p in changed if not session.in_fence(p)]
    if outside:
        shown = ", ".join(outside[:5]) + (" ..." if len(outside) > 5 else "")
        raise FenceViolation(f"changes outside the fence: {shown}; fence: {', '.join(session.fence)}",
                             "undo them yourself (cutile-perf never touches them), or fence them at init with --allow")
    paths = iteration.fenced_changes(session, changed)
    if not paths:
        raise NoChange(f"no change to the fenced files ({', '.join(session.fence)})", "edit the kernel, then run try again")
    root = git_ops.root(g)
    for rel in paths:
        target = root / rel
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise Refused(f"{rel} is not a regular file (a symlink or a folder): the commit would not hold the "
                          "code that runs", "replace it with the file's content")
    filtered = git_ops.filtered_paths(g, paths)
    if filtered:
        raise Refused(f"git attributes (a clean filter, ident or eol conversion) would commit other bytes than the "
                      f"work tree holds for {', '.join(filtered)}", "remove the attribute for the fenced files")
    return paths


def commit_message(number: int, optimization: str, reference: str, extra: dict[str, str] | None = None) -> str:
    trailers = {"Iteration": str(number), "Baseline": reference, **(extra or {})}
    return f"cutile-perf {number}: {optimization}\n\n" + "\n".join(f"{TRAILER}-{k}: {v}" for k, v in trailers.items())


def decision_line(data: dict) -> str:
    """``iteration N: <decision> - <reason> (patch: ...)`` from a ``try`` result's data (stop rule not included)."""
    text = f"iteration {data['iteration']}: {data['decision']} - {data.get('reason', '')}"
    if data.get("patch"):
        text += f" (patch: {data['patch']})"
    return text


class _Iteration:
    def __init__(self, session, g, history, reference: decide.Reference, state: txn.State, clock, probe):
        self.session, self.g, self.history, self.ref, self.state = session, g, history, reference, state
        self.clock, self.probe = clock, probe
        self.t: decide.Thresholds = session.thresholds
        self.runner = iteration.StageRunner(session, g, measure.Deadline(session.timeout_s), clock,
                                            on_start=lambda pgid: state.add_child(session, pgid))

    # -- measuring --------------------------------------------------------------------------------

    def stage(self, name: str, tag: str, commit: str) -> measure.Stage:
        say(f"iteration {self.state.iteration}: {name}" + (f" ({tag.split('-', 1)[1]})" if "-" in tag else ""))
        return self.runner.stage(name, tag, commit)

    def kernel_name_problem(self, perf: measure.Stage) -> str | None:
        if not self.ref.kernel_names:
            return None
        defined = self.runner.defined_names(self.state.candidate)
        for case, _baseline_name in sorted(self.ref.kernel_names.items()):
            name = perf.kernel_names.get(case)
            if name is None or not measure.names_defined(name, defined):
                return (f"case {case} recorded kernel {name!r}, which the fenced files do not define "
                        "(the measured kernel is not the candidate's)")
        return None

    def measure(self) -> tuple[decide.Verdict, measure.Stage | None, dict]:
        number, cand = self.state.iteration, self.state.candidate
        if self.session.prestart_perf:
            say(f"iteration {number}: correctness (perf child started, held before its first test)")
            corr, perf = self.runner.correctness_then_perf(
                f"{number}", cand, proceed=lambda c: not decide.judge(self.ref, self.t, correctness=c.evidence()).final)
        else:
            corr, perf = self.stage("correctness", f"{number}", cand), None
        verdict = decide.judge(self.ref, self.t, correctness=corr.evidence())
        if verdict.final:
            return self._with_output(verdict, corr), None, {}
        if perf is None:
            perf = self.stage("perf", f"{number}", cand)
        else:
            say(f"iteration {number}: perf")
        problem = self.kernel_name_problem(perf) if perf.ok else None
        if problem:
            return decide.Verdict("crash", f"perf measured-wrong-code: {problem}", CrashClass.MEASURED_WRONG_CODE.value), perf, {}
        verdict = decide.judge(self.ref, self.t, correctness=corr.evidence(), perf=perf.evidence())
        paired: dict | None = None
        while verdict.action == "re-measure":
            paired = paired or {c: ([], []) for c in self.ref.medians}
            k = len(next(iter(paired.values()))[0]) + 1
            for side, commit in ((0, self.ref.commit), (1, cand)):
                run = self.stage("perf", f"{number}-confirm{k}-{'base' if side == 0 else 'cand'}", commit)
                check = decide.judge_records(run.evidence(), self.ref, self.t)
                if check.final:  # a crash of a confirmation run is the iteration's crash
                    return decide.Verdict("crash", f"interleaved re-check: {check.reason}", check.crash_class), perf, {}
                for case in paired:
                    paired[case][side].append(run.shapes[case])
            verdict = decide.judge(self.ref, self.t, correctness=corr.evidence(), perf=perf.evidence(), paired=paired)
        extra = {"confirm": {c: {"base": b, "candidate": s} for c, (b, s) in paired.items()}} if paired else {}
        return self._with_output(verdict, perf), perf, extra

    @staticmethod
    def _with_output(verdict: decide.Verdict, stage: measure.Stage) -> decide.Verdict:
        if verdict.crash_class and stage.output not in verdict.reason:
            return decide.Verdict(verdict.action, f"{verdict.reason} (see {stage.output})", verdict.crash_class,
                                  verdict.decision, verdict.review)
        return verdict

    def changed_during_run(self) -> bool:
        for rel in self.state.paths:
            if git_ops.worktree_blob_sha(self.g, rel) != git_ops.blob_sha_at(self.g, self.state.candidate, rel):
                return True
        return False

    # -- the transaction --------------------------------------------------------------------------

    def run(self) -> Outcome:
        s, state = self.session, self.state
        candidate = git_ops.commit_paths(self.g, state.paths, commit_message(state.iteration, state.optimization,
                                                                             self.ref.commit))
        state.advance(s, "committed", candidate=candidate)
        with self.runner:
            verdict, perf, extra = self.measure()
        if self.changed_during_run():
            # An edit made while pytest ran is not what was measured: never keep it; the latest
            # content goes into the patch when the branch is settled.
            verdict = decide.Verdict("crash", "the fenced files changed while the tests ran; the latest version "
                                     "is in the patch", CrashClass.CHANGED_DURING_RUN.value)
        state.advance(s, "measured")
        row = self.row(verdict, perf, extra)
        if verdict.action == "keep":
            row["commit"] = git_ops.amend_message(self.g, self.trailers_message(verdict, row))
        state.advance(s, "decided", row=row)
        row = iteration.settle_interrupted(s, self.g, state, crash_class="error", reason="", clock=self.clock)
        return self.outcome(row)

    def row(self, verdict: decide.Verdict, perf: measure.Stage | None, extra: dict) -> dict:
        status = verdict.action
        correctness = "FAIL" if status == "crash" and verdict.crash_class in (
            "compile", "fault", "timeout", "no-tests", "incomplete-tests", "error") and perf is None else "PASS"
        if status == "revert" and verdict.crash_class == "wrong-result":
            correctness = "FAIL"
        fields = dict(crash_class=verdict.crash_class, patch=self.state.patch if status != "keep" else None,
                      reason=verdict.reason, review=verdict.review, reference_commit=self.ref.commit, **extra)
        if verdict.decision is not None:
            fields["decision"] = asdict(verdict.decision)
        fields.update(self.runner.row_fields())
        if perf is not None and perf.shapes:
            fields["shapes"] = iteration.shapes_field(perf.shapes, perf.test_ids)
            if status != "crash" and set(self.ref.medians) <= set(perf.shapes):
                fields["latency_ms"] = decide.combine_latency({c: perf.shapes[c] for c in self.ref.medians})
        return iteration.base_entry(self.session, iteration=self.state.iteration, optimization=self.state.optimization,
                                    status=status, correctness=correctness, commit=self.state.candidate,
                                    base_commit=self.state.base, clock=self.clock, probe=self.probe, **fields)

    def trailers_message(self, verdict: decide.Verdict, row: dict) -> str:
        d = verdict.decision
        extra = {"Verdict": f"keep ({d.tier})" if d else "keep"}
        if d is not None and d.geomean_change is not None:
            extra["Geomean"] = decide.format_change(d.geomean_change)
        if d is not None and d.worst_shape:
            gate = d.gates.get(d.worst_shape)
            change = d.changes.get(d.worst_shape)
            extra["Worst-Case"] = (f"{d.worst_shape} {decide.format_change(change) if change is not None else '?'}"
                                   + (f" (gate {gate * 100:.1f} %)" if gate is not None else ""))

        extra["Log-Prev"] = log.head_hash(self.session.log_path)
        if verdict.review:
            extra["Review"] = "claimed speedup beyond the plausibility factor; re-measured interleaved"
        return commit_message(self.state.iteration, self.state.optimization, self.ref.commit, extra)

    def outcome(self, row: dict) -> Outcome:
        stop = decide.stop_condition(iteration.open_history(self.session, self.g).rows, self.t)
        status = row["status"]
        code = {"keep": EXIT_OK, "revert": EXIT_REJECTED}.get(status, EXIT_CRASH)
        data = {"iteration": row["iteration"], "decision": status, "reason": row.get("reason", ""),
                "patch": row.get("patch"), "latency_ms": row.get("latency_ms"), "commit": row.get("commit"),
                "crash_class": row.get("crash_class"), "review": row.get("review", False), "stop": stop}
        text = decision_line(data)
        if stop:
            text += f"; stop: {stop}"
        return Outcome(text, data, code)


def try_(*, repo: Path, optimization: str) -> Outcome:
    clock = iteration.Clock()  # from the first line: the harness time includes loading and checks
    optimization = " ".join(optimization.split())
    if not optimization:
        raise UsageError("the optimization description is empty", 'e.g. cutile-perf try "occupancy 2 -> 4"')
    probe = envcheck.Probe()  # nvidia-smi and versions in the background while git and pytest work
    session = session_mod.load(repo)
    iteration.require_gpu(session, probe)
    with session_mod.locked(session.repo, "try", optimization=optimization):
        g = git_ops.open_repo(session.repo)
        iteration.require_session_branch(session, g)
        if txn.State.load(session) is not None:
            raise Refused("an interrupted iteration is not settled yet", "run `cutile-perf resume`")
        history = iteration.open_history(session, g)
        reference = history.reference()
        if reference is None:
            raise Refused("no baseline recorded yet", "run `cutile-perf baseline` first")
        base = history.kept_commit(session.base_commit)
        head = git_ops.head(g)
        if head != base:
            iteration.refuse_foreign_commits(session, g, base, head)
        paths = candidate_paths(session, g)
        number = history.next_iteration()
        name = f"{number}-{iteration.slug(optimization)}"
        state = txn.State(iteration=number, optimization=optimization, name=name, base=base,
                          reference=reference.commit, paths=paths)
        # The change is on disk, outside the work tree, before anything moves.
        state.patch = txn.save_patch(session, g, base, paths, name)
        state.advance(session, "started")
        it = _Iteration(session, g, history, reference, state, clock, probe)
        try:
            return it.run()
        except OSError as exc:  # the log or the sandbox cannot be written (read-only, disk full)
            _abort(session, g, state, clock, probe, exc)
            raise IterationCrashed(f"iteration {number} could not be recorded: {exc}",
                                   f"the change is saved in {state.patch or '(nothing to save)'}; fix the cause, then "
                                   "run `cutile-perf resume`") from exc
        except BaseException as exc:
            _abort(session, g, state, clock, probe, exc)
            raise


def _abort(session, g, state: txn.State, clock, probe, exc: BaseException) -> None:
    """Settle an iteration that an exception or a signal stopped; the error then propagates."""
    interrupted = isinstance(exc, KeyboardInterrupt)
    kind = CrashClass.INTERRUPTED if interrupted else CrashClass.ERROR
    try:
        iteration.settle_interrupted(session, g, state, crash_class=kind.value, clock=clock, probe=probe,
                                     reason=f"{kind.value}: {type(exc).__name__}: {exc}")
    except BaseException as second:  # the log cannot be written: still never leave the candidate applied
        try:
            kept = state.step in ("recorded", "settled") and (state.row or {}).get("status") == "keep"
            if not kept:
                txn.revert_to_base(session, g, state)
        finally:
            say(f"could not finish iteration {state.iteration} ({type(second).__name__}: {second}); the change is "
                f"saved in {state.patch or 'no patch (nothing changed)'}; run `cutile-perf resume` once the cause is fixed")
