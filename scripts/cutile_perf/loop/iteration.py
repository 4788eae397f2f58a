"""One iteration as one transaction: the change committed, measured as committed, judged, recorded, settled.

    started -> committed -> measured -> decided -> recorded -> settled

``Iteration`` owns the whole of it; ``try``, ``resume``, ``batch`` and ``demo`` reach it through
``try_change`` and ``resume_interrupted``. Each step persists itself through ``State``, which knows
its file (``sandbox/iteration.json``) and is rewritten atomically *after* the step is done, so
whatever stops the process (kill -9, Ctrl-C, SIGTERM, a full disk, a read-only log), ``finish``
completes the transaction the one consistent way:

=========== ================================================= ===================================
step        what is durable                                   finish (``resume``)
=========== ================================================= ===================================
started     the patch of the change (saved before anything)   log an ``interrupted`` row, reset
committed   + the candidate commit                            log an ``interrupted`` row, reset
measured    + the evidence                                    log an ``interrupted`` row, reset
decided     + the row to append                               record that row, settle by it
recorded    + the row is in the log (its hash is stored)      settle by it (no second row)
settled     nothing left to do                                remove the state
=========== ================================================= ===================================

Recording (``History.record``: append, anchor; then the view from its rows) is idempotent, so the
windows *inside* the steps are safe too: ``tests/test_loop_windows.py`` kills the process in each of them.

Settling a row that is not a keep is ``revert``: save the latest work-tree content of the fenced
files as the row's patch, then move the branch back. It is the only revert in the loop.

Its parts live by concern: the refusals before a try starts in ``loop/guards.py``, the persisted
state in ``loop/iteration_state.py``, the row and the commit message in ``loop/row.py``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.child import envcheck, measure
from cutile_perf.errors import IterationCrashed, Locked
from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.verdict import Evidence, Reference, Stage, Verdict, correctness_status, judge, stopped
from cutile_perf.loop import watchdog
from cutile_perf.loop.budget import Budget, BudgetSpent, DoesNotFit, recheck_cost_after, try_estimate
from cutile_perf.loop import offbranch, render
from cutile_perf.loop import guards
from cutile_perf.loop.iteration_state import STEPS, State, end_children, state_key
from cutile_perf.loop.row import (Clock, commit_message, fenced_content_hash, keep_message, patch_name, prior_ratios,
                                  reverted_before, save_patch, unfinished_row, verdict_row)
from cutile_perf.loop.stages import Request, Stages, StageRunner
from cutile_perf.output import say
from cutile_perf.store import git_ops, session as session_mod
from cutile_perf.store.history import History
from cutile_perf.store.session import Session


# --- the transaction --------------------------------------------------------------------------------


class Iteration:
    """One change tried as one transaction; every step goes through ``state``."""

    def __init__(self, session: Session, g, history: History, state: State, clock: Clock,
                 probe: envcheck.Probe | None = None, reference: Reference | None = None,
                 budget: Budget | None = None):
        self.session, self.g, self.history, self.state = session, g, history, state
        self.clock, self.probe = clock, probe
        self.ref = reference
        self.budget = budget  # the job's time: no stage starts, and no stage's result counts, past its end
        self.correctness_seen: str | None = None  # PASS or FAIL once the correctness stage was judged
        self._content_hash: str | None = None

    @classmethod
    def begin(cls, session: Session, g, history: History, optimization: str, clock: Clock,
              probe: envcheck.Probe | None = None, budget: Budget | None = None,
              plan_entry: str | None = None) -> Iteration:
        """Check, then save the change's patch outside the work tree before anything moves."""
        base = guards.require_settled(session, g, history)
        paths = guards.candidate_paths(session, g)
        guards.refuse_probes(g, base, paths)
        reference = history.reference()
        number = history.next_iteration()
        name = patch_name(number, optimization)
        state = State(file=State.path(session), key=state_key(g), iteration=number, optimization=optimization,
                      name=name, base=base, reference=reference.commit, paths=paths, plan_entry=plan_entry)
        state.patch = save_patch(session, g, base, paths, name)
        state.advance("started")
        return cls(session, g, history, state, clock, probe, reference, budget)

    # -- measuring --------------------------------------------------------------------------------

    def _run(self, stages: Stages, request: Request) -> Stage:
        run = request.tag.partition("-")[2]  # "confirm1-base" of "4-confirm1-base"; "" for the try's own runs
        recheck = run.startswith("confirm")
        # A re-check run names its scope: a run of every case costs a whole perf run (the geomean is in doubt).
        scope = f", {len(request.cases)} case(s) in doubt" if request.cases else (", every case" if recheck else "")
        say(f"iteration {self.state.iteration}: {request.name}" + (f" ({run})" if run else "") + scope)
        self._within_budget(f"before the {request.name} run")
        stage = stages.run(request)
        self._within_budget(f"during the {request.name} run" + (f" {run}" if recheck else ""))
        return stage

    def _within_budget(self, when: str) -> None:
        """Raise ``BudgetSpent`` once the job's budget has ended. Every child's timeout is capped at
        that end, so a stage that ended after it was cut short by the budget, not by the change:
        it is no evidence (not a ``timeout`` of the candidate), and no further stage starts."""
        if self.budget is not None and self.budget.spent():
            raise BudgetSpent(f"the job's time budget ran out {when}")

    def measure(self, stages: Stages) -> tuple[Evidence, Verdict]:
        """Run stages until the judge's verdict is final: correctness, perf, interleaved pairs. Before
        each run the stages are told what follows it if the verdict goes on (``Stages.expect``)."""
        ref, t = self.ref, self.session.thresholds
        number, cand = self.state.iteration, self.state.candidate
        perf_run = Request("perf", f"{number}", cand)
        stages.expect([perf_run])
        evidence = Evidence(correctness=self._run(stages, Request("correctness", f"{number}", cand)),
                            repeat_of=reverted_before(self.history.rows, self.content_hash()),
                            prior_ratios=prior_ratios(self.history.rows, self.content_hash(), ref))
        verdict = judge(ref, t, evidence)
        # What the tests showed, for a row the harness's own failure or an interruption ends later.
        self.correctness_seen = correctness_status(verdict, perf_ran=False) if verdict.final else "PASS"
        if verdict.final:
            return evidence, verdict
        perf = self._run(stages, perf_run)
        defined = frozenset(stages.defined_names(cand)) if ref.kernel_names and perf.ok else None
        evidence = evidence.add(perf=perf, defined_names=defined)
        verdict = judge(ref, t, evidence)
        if verdict.action == "re-measure":
            self._recheck_fits(perf, verdict.cases)
        # The loop asks the judge after every run, so the re-check stops at the first run after
        # which its verdict is final (a crashed baseline run ends it before the candidate's).
        while verdict.action == "re-measure":
            k = len(evidence.pairs) + 1
            # Only the cases in doubt, selected by the node ids their records came from.
            doubt = {case: perf.test_ids.get(case) for case in verdict.cases} or None
            order = self._recheck_runs(first_pair=k, cases=doubt)
            stages.expect(order[1:])
            base_run = self._run(stages, order[0])
            evidence = evidence.add(pairs=(*evidence.pairs, (base_run, None)))
            verdict = judge(ref, t, evidence)
            if verdict.final:
                break
            stages.expect(order[2:])
            cand_run = self._run(stages, order[1])
            evidence = evidence.add(pairs=(*evidence.pairs[:-1], (base_run, cand_run)))
            verdict = judge(ref, t, evidence)
        return evidence, verdict

    def _recheck_fits(self, perf: Stage, cases: tuple[str, ...]) -> None:
        """Raise ``BudgetSpent`` when the job's budget cannot hold the re-check as this session's
        re-checks went (``budget.recheck_cost``): it could reach no verdict, and the time left may
        still hold another try of a batch. ``cases``: the cases in doubt (): every case."""
        if self.budget is None:
            return
        cost = recheck_cost_after(self.history.rows, perf, cases, self.session.thresholds)
        if not self.budget.fits(cost.seconds):
            raise BudgetSpent(f"the job's time budget cannot hold the re-check: it needs {cost.describe()}, "
                              f"{self.budget.left():.0f} s are left")
        say(f"iteration {self.state.iteration}: the re-check takes {cost.describe()}; {self.budget.left():.0f} s left")

    def _recheck_runs(self, first_pair: int, cases: dict | None = None) -> list[Request]:
        """The interleaved re-check's runs from pair ``first_pair`` to the last one the thresholds
        allow, in order: base, then candidate, of each pair."""
        # Pairs whose baseline run drifted are replaced by more, past max_confirm_pairs (``verdict.last_pair``).
        number, last = self.state.iteration, max(self.session.thresholds.max_confirm_pairs, first_pair)
        return [Request("perf", f"{number}-confirm{j}-{side}", commit, cases)
                for j in range(first_pair, last + 1)
                for side, commit in (("base", self.ref.commit), ("cand", self.state.candidate))]

    def content_hash(self) -> str:
        if self._content_hash is None:
            self._content_hash = fenced_content_hash(self.session, self.g, self.state.candidate)
        return self._content_hash

    def changed_during_run(self) -> bool:
        return any(git_ops.worktree_blob_sha(self.g, rel) != git_ops.blob_sha_at(self.g, self.state.candidate, rel)
                   for rel in self.state.paths)

    # -- the steps ----------------------------------------------------------------------------------

    def run(self, stages: Stages) -> dict:
        """commit -> measure -> decide -> record -> settle; returns the row."""
        s, state = self.session, self.state
        candidate = git_ops.commit_paths(self.g, state.paths, commit_message(state.iteration, state.optimization,
                                                                             self.ref.commit))
        state.advance("committed", candidate=candidate)
        with stages:
            evidence, _ = self.measure(stages)
            fields_of_runner = stages.row_fields()
        moved = git_ops.moved_since(self.g, s.branch, candidate, state.paths)
        verdict = judge(self.ref, s.thresholds, evidence.add(git_moved=moved,
                                                             changed_during_run=not moved and self.changed_during_run()))
        state.advance("measured")
        row = verdict_row(s, state, self.ref, verdict, evidence, fields_of_runner, content_hash=self.content_hash(),
                          clock=self.clock, probe=self.probe)
        if verdict.action == "keep":  # HEAD is the candidate on the session branch (moved_since said so)
            message = keep_message(state, self.ref.commit, verdict, log_prev=self.history.head_hash())
            row["commit"] = git_ops.amend_message(self.g, message)
        state.advance("decided", row=row)
        return self.finish()

    def finish(self, unfinished: Verdict | None = None) -> dict:
        """Complete the transaction from whatever step it reached; returns its row.

        Before ``decided`` there is no verdict: the row is a crash of ``unfinished``'s class. From
        ``decided`` on the prepared row is recorded (once) and the branch settled by it.
        """
        state = self.state
        if STEPS.index(state.step) < STEPS.index("decided"):
            verdict = unfinished or stopped(None, "stopped before a verdict")
            state.advance("decided", row=unfinished_row(self.session, state, verdict, clock=self.clock,
                                                        probe=self.probe, correctness_seen=self.correctness_seen))
        if state.step == "decided":
            row_hash = self.history.record(state.row)
            # The view before the step moves on: a kill after "recorded" never comes back here.
            render.write_perf_results(self.session.results_path, self.history.rows)
            state.advance("recorded", row_hash=row_hash)
        if state.step == "recorded":
            if state.row.get("status") != "keep":
                self.revert()
            state.advance("settled")
        state.clear()
        return state.row

    def revert(self) -> str | None:
        """Save the fenced files' latest content, then move the branch back to the base.

        The patch is re-saved from the work tree (not from the candidate commit), so an edit made while
        the tests ran is in it too. Files outside ``state.paths`` are never touched.
        """
        state = self.state
        # Only the session branch moves back: HEAD re-pointed at another branch (by a child, or a
        # user) would otherwise carry the reset to that branch.
        git_ops.point_head_at(self.g, self.session.branch)
        latest = save_patch(self.session, self.g, state.base, state.paths, state.name)
        knobs.kill_point("revert:patch-saved")
        git_ops.reset_to(self.g, state.base, state.paths)
        return latest or state.patch

    def abort(self, exc: BaseException) -> None:
        """Settle an iteration that an exception or a signal stopped; the error then propagates."""
        try:
            self.finish(harness_stopped(exc))
        except BaseException as second:  # the log cannot be written: still never leave the candidate applied
            try:
                state = self.state
                kept = state.step in ("recorded", "settled") and (state.row or {}).get("status") == "keep"
                if not kept:
                    self.revert()
            finally:
                say(f"could not finish iteration {self.state.iteration} ({type(second).__name__}: {second}); the "
                    f"change is saved in {self.state.patch or 'no patch (nothing changed)'}; run `cutile-perf resume` "
                    "once the cause is fixed")


def harness_stopped(exc: BaseException) -> Verdict:
    """The verdict on an iteration an exception stopped: Ctrl-C or SIGTERM is an interruption
    (``stopped``), anything else the harness's own failure (crash class ``harness``, never a verdict
    on the change), named by its exception."""
    if isinstance(exc, KeyboardInterrupt):
        return stopped(exc)
    return Verdict("crash", f"harness: {type(exc).__name__}: {exc}"[:300], crash_class=CrashClass.HARNESS)


# --- the library API the commands call --------------------------------------------------------------


@dataclass(frozen=True)
class TryResult:
    row: dict
    stop: str | None  # the stop rule's advice after this row, or None
    history: History  # the log after this row, in memory (a batch asks it before the next try)
    cut: str | None = None  # why the job's budget stopped it before a verdict (its row is ``interrupted``)


def try_change(repo: Path, optimization: str, *, stages: Stages | None = None, budget: Budget | None = None,
               plan_entry: str | None = None) -> TryResult:
    """One ``try``: the change in the work tree, committed, measured, judged, recorded, settled.

    ``stages``: what runs the tests (default: pytest children in pristine checkouts, ``StageRunner``);
    tests pass a ``ScriptedStages``. ``budget``: the job's time (``budget.Budget``): refused
    (``DoesNotFit``, nothing touched) unless a typical try of this session fits what is left; each
    child's timeout is capped at its end; a try it cuts short is settled as ``interrupted``
    (``TryResult.cut``). ``plan_entry``: the batch plan entry's digest, recorded in the row.
    """
    clock = Clock()  # from the first line: the harness time includes loading and checks
    probe = envcheck.Probe()  # nvidia-smi and versions in the background while git and pytest work
    session = session_mod.load(repo)
    guards.require_gpu(session, probe)
    with session_mod.locked(session.repo, "try", optimization=optimization):
        g = git_ops.open_repo(session.repo)
        guards.require_nothing_pending(session, g)
        history = History.open(session, g)
        if budget is not None:
            expected = try_estimate(history.rows, session.thresholds)
            if expected is not None and not budget.fits(expected.typical_s):
                raise DoesNotFit(f"{budget.left():.0f} s of the job's budget are left; {expected.describe()}",
                                 "nothing was changed; run it in the next job, or give the job more time")
        it = Iteration.begin(session, g, history, optimization, clock, probe, budget, plan_entry)
        timeout_s = budget.cap(session.timeout_s) if budget is not None else session.timeout_s
        if stages is not None:
            stages.clock = clock  # scripted stages time themselves into this row, as StageRunner does
        runner = stages if stages is not None else StageRunner(session, g, measure.Deadline(timeout_s), clock,
                                                               on_start=it.state.add_child, preload=history.preload())
        cut = None
        try:
            try:
                with watchdog.overrun_guard(timeout_s, "try"):
                    row = it.run(runner)
            except BudgetSpent as exc:
                # The job's time ended the run, not the change: settled as an interruption (row,
                # revert, the change kept in its patch), so the next job can try it again.
                cut = str(exc)
                row = it.finish(stopped(None, f"interrupted: {cut}; not a verdict on the change"))
        except OSError as exc:  # the log or the sandbox cannot be written (read-only, disk full)
            it.abort(exc)
            raise IterationCrashed(f"iteration {it.state.iteration} could not be recorded: {exc}",
                                   f"the change is saved in {it.state.patch or '(nothing to save)'}; fix the cause, "
                                   "then run `cutile-perf resume`") from exc
        except BaseException as exc:
            it.abort(exc)
            raise
        return TryResult(row, history.stop(), history, cut)


@dataclass(frozen=True)
class ResumeResult:
    actions: list[str]
    head: str
    pending: list[str]  # fenced paths with an uncommitted change waiting for `try`
    settled_off_branch: bool = False  # ``settle_off_branch`` ran: the kept commit was off the branch


# How ``resume`` settles a last kept commit that is no longer on the branch (``loop.adopt``):
# (session, repository, history, what became of the commit) -> the action line.
SettleOffBranch = Callable[[Session, object, History, offbranch.OffBranch], str]


def resume_interrupted(repo: Path, settle_off_branch: SettleOffBranch | None = None) -> ResumeResult:
    """After a kill: end the killed run's children, finish its iteration, check HEAD is the kept commit.

    ``settle_off_branch``: the way on the user chose (``resume --adopt`` or ``--reset-to-kept``) when
    the last kept commit was amended, rebased or reset away; without it that state is refused with
    both ways named."""
    session = session_mod.load(repo)
    lock = session_mod.read_lock(session.repo)
    stale = lock is not None and session_mod.lock_is_stale(lock)
    if lock is not None and not stale:
        raise Locked(f"a cutile-perf `{lock.get('command')}` (pid {lock.get('pid')}) is still running",
                     "wait for it; resume is for runs that were killed")
    clock = Clock()
    g = git_ops.open_repo(session.repo)
    # Before the lock: a stale lock (it names the killed run's optimization) must outlive a refusal.
    guards.require_session_branch(session, g)
    with session_mod.locked(session.repo, "resume", replace_stale=True):
        actions: list[str] = []
        if stale:
            actions.append(f"removed the stale lock of a killed `{lock.get('command')}` (pid {lock.get('pid')})")
        state = State.load(session, state_key(g))
        if state is not None:
            ended = end_children(state.children)
            if ended:
                actions.append(f"ended {len(ended)} child process group(s) of the killed run")
        pending_row = state.row if state is not None and state.step == "decided" else None
        history = History.open(session, g, pending_row=pending_row)
        if state is not None:
            step = state.step
            say(f"finishing iteration {state.iteration} (stopped after: {step})")
            it = Iteration(session, g, history, state, clock)
            row = it.finish(stopped(None, f"the run was stopped after step '{step}'; finished by resume"))
            actions.append(f"iteration {row['iteration']}: {row['status']}"
                           + (f" ({row.get('crash_class')})" if row.get("crash_class") else "")
                           + (f", change saved in {row['patch']}" if row.get("patch") else ""))
        kept = history.kept_commit()
        head = git_ops.head(g)
        off = offbranch.off_branch(g, kept, head) if head != kept else None
        if head != kept and (off is None or settle_off_branch is None):
            guards.refuse_foreign_commits(session, g, kept, head)
        if off is not None:
            actions.append(settle_off_branch(session, g, history, off))
            kept = history.kept_commit()
        return ResumeResult(actions, kept, guards.paths_touched(session, g, kept), settled_off_branch=off is not None)
