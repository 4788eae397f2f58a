"""What the judge reads and what it says: one child's ``Stage``, the baseline's ``Reference``, an
iteration's ``Evidence`` so far, and the ``Verdict`` (``judge.verdict.judge`` turns the first three
into the last). Plain frozen data, filled by ``child.measure`` and ``loop.iteration``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.rules import Decision


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


def crash_verdict(crash: CrashClass, reason: str, stage: Stage | None = None) -> Verdict:
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


def case_names(cases, shown: int = 3) -> str:
    """The first ``shown`` of ``cases`` for a verdict's reason, and how many more."""
    return ", ".join(cases[:shown]) + (f" and {len(cases) - shown} more" if len(cases) > shown else "")


def asked_cases(cases, every) -> tuple[str, ...]:
    """``Verdict.cases`` for a re-measure of ``cases``: () when that is every case (no selection)."""
    return () if set(cases) >= set(every) else tuple(cases)
