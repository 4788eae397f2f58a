"""``cutile-perf try "<optimization>"``: test, measure, commit, decide, keep or revert one change.

Order (each step only runs when the previous one passed): fence check -> change present ->
correctness -> perf -> commit -> decide (-> interleaved confirmation) -> record -> keep or revert.
Whatever happens, the ``finally`` leaves the repository at a known commit: the candidate when kept,
the last kept commit otherwise, with the candidate's patch saved first.
"""
from __future__ import annotations

from dataclasses import asdict, is_dataclass
from pathlib import Path

from cutile_perf import decide, envcheck, git_ops, iteration, log, measure
from cutile_perf import session as session_mod
from cutile_perf.commands import Outcome, say
from cutile_perf.errors import EXIT_CRASH, EXIT_OK, EXIT_REJECTED, FenceViolation, Refused, UsageError

CONFIRM_PAIRS_DEFAULT = 3


def _decision_dict(decision) -> dict:
    if is_dataclass(decision):
        return asdict(decision)
    return dict(decision)


class _Iteration:
    """State of one ``try``: what to save and where to go back if anything fails."""

    def __init__(self, session: session_mod.Session, g, optimization: str, entries: list[dict],
                 clock: iteration.Clock, probe: envcheck.Probe):
        self.session, self.g, self.optimization, self.entries = session, g, optimization, entries
        self.base = iteration.kept_commit(session, entries)
        self.baseline = log.current_baseline(entries) or {}
        self.base_medians = log.shape_medians(self.baseline)
        self.noise = iteration.noise_of(entries)
        self.number = log.next_iteration(entries)
        self.name = f"{self.number}-{iteration.slug(optimization)}"
        self.clock = clock
        self.probe = probe
        self.deadline = measure.Deadline(session.timeout_s)
        self.thresholds = decide.Thresholds.from_dict(session.thresholds)
        self.paths: list[str] = []
        self.snapshot: dict[str, str | None] = {}  # the fenced files' hashes when the tests started
        self.candidate: str | None = None
        self.patch: str | None = None
        self.settled = False  # kept, or reverted and reset

    def stage(self, name: str, tag: str) -> measure.Stage:
        say(f"iteration {self.number}: {name}")
        result = measure.run_stage(self.session, name, tag, self.deadline)
        self.clock.add_child(result.duration_s)
        return result

    def save_patch(self) -> None:
        if self.patch is None:
            self.patch = iteration.save_patch(self.session, self.g, self.base, self.paths, self.name)

    def revert(self, *, status: str, correctness: str, crash_class: str | None, reason: str, **extra) -> Outcome:
        # kill -9 after this line: the patch is on disk and logged; resume only has to reset.
        self.save_patch()
        entry = iteration.base_entry(
            self.session, iteration=self.number, optimization=self.optimization, status=status,
            correctness=correctness, commit=self.candidate, base_commit=self.base, clock=self.clock,
            probe=self.probe, crash_class=crash_class, patch=self.patch, reason=reason, **extra)
        entries = iteration.record(self.session, entry)
        git_ops.reset_to(self.g, self.base, self.paths)
        self.settled = True
        return self.outcome(entry, entries)

    def keep(self, decision: dict, perf: measure.Stage, **extra) -> Outcome:
        entry = iteration.base_entry(
            self.session, iteration=self.number, optimization=self.optimization, status="keep", correctness="PASS",
            commit=self.candidate, base_commit=self.base, clock=self.clock, probe=self.probe, crash_class=None,
            patch=None, reason=decision.get("reason", ""), decision=decision,
            shapes=iteration.shapes_field(perf.shapes, perf.test_ids),
            latency_ms=decide.combine_latency(perf.shapes), **extra)
        entries = iteration.record(self.session, entry)
        self.settled = True
        return self.outcome(entry, entries)

    def outcome(self, entry: dict, entries: list[dict]) -> Outcome:
        stop = decide.stop_condition(entries, self.thresholds)
        status = entry["status"]
        code = {"keep": EXIT_OK, "revert": EXIT_REJECTED}.get(status, EXIT_CRASH)
        data = {"iteration": self.number, "decision": status, "reason": entry.get("reason", ""),
                "patch": entry.get("patch"), "latency_ms": entry.get("latency_ms"), "commit": entry.get("commit"),
                "crash_class": entry.get("crash_class"), "stop": stop}
        text = decision_line(data)
        if stop:
            text += f"; stop: {stop}"
        return Outcome(text, data, code)

    def cleanup_after_error(self, exc: BaseException) -> None:
        """An exception escaped mid-iteration (Ctrl-C, a bug): save, log a crash row, go back."""
        self.save_patch()
        kind = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
        entry = iteration.base_entry(
            self.session, iteration=self.number, optimization=self.optimization, status="crash", correctness="FAIL",
            commit=self.candidate, base_commit=self.base, clock=self.clock, probe=self.probe, crash_class=kind,
            patch=self.patch, reason=f"{kind}: {type(exc).__name__}: {exc}"[:300])
        iteration.record(self.session, entry)
        git_ops.reset_to(self.g, self.base, self.paths)
        self.settled = True


def decision_line(data: dict) -> str:
    """``iteration N: <decision> - <reason> (patch: ...)`` from a ``try`` result's data (stop rule not included)."""
    text = f"iteration {data['iteration']}: {data['decision']} - {data.get('reason', '')}"
    if data.get("patch"):
        text += f" (patch: {data['patch']})"
    return text


def _run(it: _Iteration) -> Outcome:
    corr = it.stage("correctness", f"{it.number}")
    if not corr.ok:
        # A wrong answer is an ordinary rejected change; anything else is a crash of the iteration.
        status = "revert" if corr.crash == "wrong-result" else "crash"
        return it.revert(status=status, correctness="FAIL", crash_class=corr.crash,
                         reason=f"correctness {corr.crash}: {corr.detail} (see {corr.output})")
    perf = it.stage("perf", f"{it.number}")
    missing = sorted(set(it.base_medians) - set(perf.shapes)) if perf.ok else []
    if not perf.ok or missing:
        crash = perf.crash or "no-record"
        detail = perf.detail or f"shapes missing from the candidate's records: {', '.join(missing)}"
        return it.revert(status="crash", correctness="PASS", crash_class=crash,
                         reason=f"perf {crash}: {detail} (see {perf.output})")
    if iteration.fingerprint(it.session, it.paths) != it.snapshot:
        # An edit made while pytest ran would be committed (and maybe kept) as code nobody measured.
        # Crash instead; the latest content is in the saved patch.
        return it.revert(status="crash", correctness="PASS", crash_class="changed-during-run",
                         reason="the fenced files changed while the tests ran; the latest version is in the patch")
    it.candidate = git_ops.commit_paths(it.g, it.paths, f"cutile-perf {it.number}: {it.optimization}")
    base_shapes = {s: it.base_medians[s] for s in perf.shapes if s in it.base_medians}
    decision = decide.decide(base_shapes, perf.shapes, it.noise, it.thresholds)
    extra: dict = {}
    if decision.verdict == "confirm":
        decision, extra, crashed = _confirm(it, list(base_shapes))
        if crashed is not None:
            return it.revert(status="crash", correctness="PASS", crash_class=crashed.crash,
                             reason=f"confirmation perf {crashed.crash}: {crashed.detail}",
                             shapes=iteration.shapes_field(perf.shapes, perf.test_ids))
    decision_data = _decision_dict(decision)
    if decision.verdict == "keep":
        return it.keep(decision_data, perf, **extra)
    return it.revert(status="revert", correctness="PASS", crash_class=None, reason=decision.reason,
                     decision=decision_data, shapes=iteration.shapes_field(perf.shapes, perf.test_ids),
                     latency_ms=decide.combine_latency(perf.shapes),
                     **extra)


def _confirm(it: _Iteration, shapes: list[str]):
    """Re-measure baseline and candidate alternately in one run, so drift hits both equally."""
    pairs = int(getattr(it.thresholds, "confirm_pairs", CONFIRM_PAIRS_DEFAULT))
    paired = {s: ([], []) for s in shapes}
    try:
        for k in range(pairs):
            for side, sha in ((0, it.base), (1, it.candidate)):
                git_ops.restore_paths(it.g, sha, it.paths)
                stage = it.stage("perf", f"{it.number}-confirm{k + 1}-{'base' if side == 0 else 'cand'}")
                if not stage.ok or set(shapes) - set(stage.shapes):
                    return None, {}, stage if not stage.ok else measure.Stage(
                        "perf", "no-record", stage.duration_s, stage.output, detail="shapes missing from a run")
                for s in shapes:
                    paired[s][side].append(stage.shapes[s])
    finally:
        # The candidate commit is HEAD: put its files back whatever happened above.
        git_ops.restore_paths(it.g, it.candidate, it.paths)
    decision = decide.confirm({s: (b, c) for s, (b, c) in paired.items()}, it.thresholds)
    return decision, {"confirm": {s: {"base": b, "candidate": c} for s, (b, c) in paired.items()}}, None


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
        entries = log.read_entries(session.log_path)
        if log.current_baseline(entries) is None:
            raise Refused("no baseline recorded yet", "run `cutile-perf baseline` first")
        it = _Iteration(session, g, optimization, entries, clock, probe)
        head = git_ops.head(g)
        if head != it.base:
            raise Refused(f"HEAD {git_ops.short(g, head)} is not the last kept commit {git_ops.short(g, it.base)}",
                          "run `cutile-perf resume`")
        changed = git_ops.changed_paths(g)
        outside = [p for p in changed if not session.in_fence(p)]
        if outside:
            shown = ", ".join(outside[:5]) + (" ..." if len(outside) > 5 else "")
            raise FenceViolation(f"changes outside the fence: {shown}; fence: {', '.join(session.fence)}",
                                 "undo them yourself (cutile-perf never touches them), or fence them at init with --allow")
        it.paths = iteration.fenced_changes(session, changed)
        if not it.paths:
            raise Refused(f"no change to the fenced files ({', '.join(session.fence)})",
                          "edit the kernel, then run try again")
        it.snapshot = iteration.fingerprint(session, it.paths)
        try:
            return _run(it)
        except BaseException as exc:
            if not it.settled:
                it.cleanup_after_error(exc)
            raise
        finally:
            if not it.settled:  # cleanup itself failed: still never leave the candidate half-applied
                it.save_patch()
                git_ops.reset_to(g, it.base, it.paths)
