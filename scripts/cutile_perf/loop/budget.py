"""How long a ``try`` takes, from what this session measured, and the time one GPU job gives it.

``estimate`` is a pure rule over the stage times the log holds (``timed`` reads them out of the
rows' ``timings``); ``Budget`` is the job's clock. ``batch`` and ``try --job-seconds`` start
a try only when a typical one fits what is left, cap every child's timeout at the budget's end,
and settle a try that the end cuts short as ``interrupted`` (``BudgetSpent``): no verdict, the
change kept in its patch, the next job tries it again. A re-check that would not end within what
is left is not started (``recheck_cost``: what it re-runs, at the start-up and the pairs this
session's re-checks took, else its floor ``recheck_floor_s``): the try is settled as interrupted at
once, and a batch goes on with the entries after it while a typical try still fits. A re-check that
then runs longer than that is cut at the budget's end, with no verdict.

Why a typical try and not the worst case: the worst case (correctness, perf and every re-check
pair at the slowest child) is several times a typical try, so a job sized for it idles most of
the time and, on a slow op, never starts a try at all (a TileGym op in an agent's GPU job, issue 21:
docs/design.md, "What a try costs"). Starting a try that then runs long costs only time the job had left anyway,
since the cut is clean and the next job continues.
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cutile_perf.errors import Refused, UsageError
from cutile_perf.judge.rules import Thresholds, was_interrupted
from cutile_perf.judge.verdict import Stage
from cutile_perf.store.log import shape_test_ids

# Stage times vary run to run (compilation, a cold file cache): a high quantile, not the mean. The
# nearest rank of 0.9 is the slowest run seen while there are fewer than ten.
QUANTILE = 0.9
# Re-check prior: tries needing the interleaved re-check are the exception, but common on a first
# fix; one in three (Laplace-like: (re-checked + 1) / (judged + 3)) until the session's tries say more.
PRIOR_RECHECKED, PRIOR_JUDGED = 1, 3
# Kept out of --job-seconds for what follows the budget's end: settling a cut try (row, revert,
# checkouts removed) and the command's own start; seconds on a local disk, more on network storage.
RESERVE_FRACTION, RESERVE_MIN_S = 0.05, 15.0


# Before a session has timed anything: what a TileGym op's children cost, 16 perf cases under
# TileGym's CUPTI timer, (cheapest, dearest) of the ops timed so far, silu_and_mul and dropout
# (TileGym times each dropout case hundreds of times). The figures and their runs:
# references/harness.md, "Batches", and benchmarks/results/2026-12-03-h200/README.md. A guess to
# warn with, never a reason to refuse: the baseline's own runs replace it.
UNMEASURED_CORRECTNESS_S = (17.0, 25.0)
UNMEASURED_PERF_S = (20.0, 50.0)


def unmeasured_first_job_s(repeats: int) -> tuple[float, float]:
    """(cheapest, dearest) seconds of a baseline of ``repeats`` perf runs and one ``try`` without
    its re-check, at ``UNMEASURED_*`` prices: what a first job must hold to reach one verdict."""
    def need(correctness: float, perf: float) -> float:
        return (correctness + repeats * perf) + (correctness + perf)
    return (need(UNMEASURED_CORRECTNESS_S[0], UNMEASURED_PERF_S[0]),
            need(UNMEASURED_CORRECTNESS_S[1], UNMEASURED_PERF_S[1]))


def recheck_floor_s(perf_run_s: float, tests_in_doubt: int, tests_run: int, min_pairs: int) -> float:
    """The least time an interleaved re-check can take: ``min_pairs`` pairs of runs (the sequential
    test decides no sooner), each at least the share of the candidate's perf run that its tests in
    doubt took (``perf_run_s`` counts only the tests: the held child's start-up is hidden). A fresh
    child pays its start-up on top, so the real re-check takes longer, never less."""
    share = 1.0 if tests_run <= 0 else min(max(tests_in_doubt, 1) / tests_run, 1.0)
    return 2 * min_pairs * perf_run_s * share


# A session's re-checks say how many pairs the next one needs once at least this many reached a
# verdict: one re-check that settled after its first pair may have been lucky.
MIN_RECHECKS_SEEN = 2


@dataclass(frozen=True)
class PastRecheck:
    """One re-check of this session's log, as ``past_rechecks`` reads it from a row."""

    pairs: int  # interleaved pairs it ran (fewer than min_confirm_pairs when it settled early)
    runs: int  # its runs, base and candidate
    seconds: float  # what they took together
    whole_runs: float  # its runs counted in whole perf runs: each run's tests over the perf run's
    perf_s: float  # the same try's perf run of every test
    decided: bool  # it ended in a verdict (keep or revert), not a crash

    @property
    def start_s(self) -> float:
        """What a re-check run cost beyond its share of the perf run's test time: the child's fixed
        start-up (a spare started ahead hides part of it). Negative when runs were quicker."""
        return (self.seconds - self.whole_runs * self.perf_s) / self.runs


@dataclass(frozen=True)
class RecheckCost:
    """What the re-check about to start will take (``recheck_cost``), and what that rests on."""

    seconds: float
    pairs: int
    start_s: float  # per run, on top of its share of the tests
    tests_in_doubt: int
    tests_run: int
    seen: tuple[int, ...] = ()  # pairs of this session's decided re-checks; () when too few to go by

    def describe(self) -> str:
        doubt = f"{self.tests_in_doubt} of {self.tests_run} perf tests in doubt"
        if not self.seen:
            return (f"at least {self.seconds:.0f} s ({self.pairs} pairs at the perf run's own speed, {doubt}; "
                    f"fewer than {MIN_RECHECKS_SEEN} re-checks timed here)")
        low, high = min(self.seen), max(self.seen)
        settled = f"{low}-{high} pairs" if low != high else _pairs(low)
        return (f"about {self.seconds:.0f} s ({doubt}; re-checks here settled after {settled}, so "
                f"{_pairs(self.pairs)}; {self.start_s:.0f} s start-up a run)")


def _pairs(n: int) -> str:
    return f"{n} pair" if n == 1 else f"{n} pairs"


def _tests_per_case(row: dict) -> dict[str, str]:
    """case -> the perf test (node id) that measured it in this row; a case without one is its own test."""
    if not isinstance(row.get("shapes"), dict):
        return {}
    return {case: str(test_id or case) for case, test_id in shape_test_ids(row).items()}


def _whole_runs(row: dict) -> float | None:
    """The row's re-check runs counted in whole perf runs: per test, the runs that re-measured it,
    over the tests the perf run ran. None when the row does not say (no ``shapes`` or ``confirm``)."""
    tests = _tests_per_case(row)
    confirm = row.get("confirm")
    if not tests or not isinstance(confirm, dict) or not confirm:
        return None
    runs_of_test: dict[str, int] = {}
    for case, sides in confirm.items():
        if not isinstance(sides, dict):
            return None
        runs = len(sides.get("base") or ()) + len(sides.get("candidate") or ())
        test = tests.get(case, case)
        runs_of_test[test] = max(runs_of_test.get(test, 0), runs)
    return sum(runs_of_test.values()) / len(set(tests.values()))


def past_rechecks(rows: Sequence[dict]) -> tuple[PastRecheck, ...]:
    """The interleaved re-checks the log's tries ran to their end, from each row's
    ``timings.stages`` (``<n>-confirm<k>-base|cand-perf``), ``shapes`` and ``confirm``. A row the
    budget or a kill interrupted is left out: its last run was cut short and it decided nothing."""
    found = []
    for row in rows:
        if row.get("iteration", -1) <= 0 or was_interrupted(row):
            continue
        stages = [(str(n), float(s)) for n, s in (row.get("timings") or {}).get("stages") or ()
                  if isinstance(s, (int, float)) and not isinstance(s, bool)]
        recheck = [(m.group(1), s) for n, s in stages if (m := _CONFIRM_TAG.search(n))]
        perf = [s for n, s in stages if n.endswith("-perf") and not _CONFIRM_TAG.search(n)]
        whole = _whole_runs(row)
        if not recheck or len(perf) != 1 or whole is None:
            continue
        found.append(PastRecheck(pairs=len({k for k, _ in recheck}), runs=len(recheck),
                                 seconds=sum(s for _, s in recheck), whole_runs=whole, perf_s=perf[0],
                                 decided=row.get("status") in ("keep", "revert")))
    return tuple(found)


def recheck_cost(past: Sequence[PastRecheck], perf_run_s: float, tests_in_doubt: int, tests_run: int,
                 min_pairs: int, max_pairs: int) -> RecheckCost:
    """What the re-check about to start will take: its pairs, each two runs of the tests in doubt.

    A run costs a fixed start-up plus its share of the perf run's test time (``perf_run_s``); the
    start-up is what this session's re-check runs took beyond their share (``PastRecheck.start_s``).
    The pairs are those its decided re-checks needed (``recheck.settled_early`` often stops after
    one), never fewer than 1 nor more than ``max_pairs``. Both are the slow end of what was seen
    (``high_quantile``). With fewer than ``MIN_RECHECKS_SEEN`` decided re-checks this is
    ``recheck_floor_s``: ``min_pairs`` pairs at the perf run's own speed. An estimate that proves
    short costs no verdict: the budget's end cuts the re-check, and the try is settled as interrupted.
    """
    decided = [p for p in past if p.decided]
    share = 1.0 if tests_run <= 0 else min(max(tests_in_doubt, 1) / tests_run, 1.0)
    if len(decided) < MIN_RECHECKS_SEEN:
        return RecheckCost(recheck_floor_s(perf_run_s, tests_in_doubt, tests_run, min_pairs), min_pairs, 0.0,
                           tests_in_doubt, tests_run)
    seen = tuple(p.pairs for p in decided)
    pairs = min(max(int(high_quantile(seen)), 1), max_pairs)
    start = max(high_quantile([p.start_s for p in past]), 0.0)
    return RecheckCost(2 * pairs * (start + share * perf_run_s), pairs, start, tests_in_doubt, tests_run, seen)


def recheck_cost_after(rows: Sequence[dict], perf: Stage, cases: Sequence[str], thresholds: Thresholds) -> RecheckCost:
    """``recheck_cost`` of the re-check that follows the perf run ``perf``, over the log's ``rows``.
    ``cases``: the cases in doubt (empty: every case); a re-check selects their perf tests by node id."""
    tests = set(perf.test_ids.values())
    doubt = {perf.test_ids.get(c) for c in cases} if cases else tests
    return recheck_cost(past_rechecks(rows), perf.duration_s, len(doubt), len(tests),
                        thresholds.min_confirm_pairs, thresholds.max_confirm_pairs)


class BudgetSpent(Exception):
    """The job's budget ended before the iteration reached a verdict (raised inside the loop and
    caught by ``try_change``, which settles the iteration as interrupted; never shown to a user)."""


class DoesNotFit(Refused):
    """A typical try does not fit what is left of the job: refused before anything is touched."""


@dataclass(frozen=True)
class Timed:
    """The stage times of a session's log, in seconds (``timed``)."""

    correctness: tuple[float, ...] = ()
    perf: tuple[float, ...] = ()  # every perf child of the whole selection: the baseline's runs, tries' runs
    harness: tuple[float, ...] = ()  # per row: wall time outside the children (lock, git, checkouts)
    judged: int = 0  # tries whose perf stage ran to the end
    rechecks: tuple[int, ...] = ()  # interleaved pairs run, per try that needed the re-check
    recheck: tuple[float, ...] = ()  # seconds of its re-check runs, per try that needed the re-check
    reference: tuple[float, ...] = ()  # the reference children of checked timed calls (``screen_cost``)


@dataclass(frozen=True)
class Estimate:
    correctness_s: float
    perf_s: float
    harness_s: float
    recheck_s: float  # what the interleaved re-check adds to a try that needs it
    recheck_pairs: int
    recheck_rate: float  # the share of tries expected to need it
    rechecked: int  # tries of this session that needed it ...
    judged: int  # ... out of these
    worst_s: float  # correctness, perf and max_confirm_pairs pairs, each at the slowest child seen

    @property
    def rechecks_typically(self) -> bool:
        return self.recheck_rate > 0.5

    @property
    def typical_s(self) -> float:
        """A try in the usual case: the median outcome includes the re-check only when most tries need it."""
        return (self.correctness_s + self.perf_s + self.harness_s
                + (self.recheck_s if self.rechecks_typically else 0.0))

    @property
    def with_recheck_s(self) -> float:
        """A try that runs the re-check: what an entry the budget's end cut short before is given."""
        return self.correctness_s + self.perf_s + self.harness_s + self.recheck_s

    def recheck_basis(self) -> str:
        """What ``recheck_s`` rests on, for the lines that name it."""
        if self.rechecked:
            return f"the slow end of the {self.rechecked} re-check(s) timed here"
        return f"{self.recheck_pairs} pairs of whole perf runs: no re-check timed here yet"

    def describe(self) -> str:
        re_check = "included" if self.rechecks_typically else "when needed"
        return (f"a try typically takes {self.typical_s:.0f} s (correctness {self.correctness_s:.0f} s + perf "
                f"{self.perf_s:.0f} s + harness {self.harness_s:.0f} s, the slowest runs measured); the re-check "
                f"adds {self.recheck_s:.0f} s ({self.recheck_pairs} pairs, {re_check}: {self.rechecked} of "
                f"{self.judged} tries so far); at most {self.worst_s:.0f} s")


def high_quantile(values: Sequence[float], q: float = QUANTILE) -> float:
    """Nearest-rank quantile: an observed value, never an interpolation below the slow runs."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


def estimate(timed: Timed, min_pairs: int, max_pairs: int) -> Estimate | None:
    """How long a try takes here; None until a correctness and a perf child were timed (the baseline does)."""
    if not timed.correctness or not timed.perf:
        return None
    c, p = high_quantile(timed.correctness), high_quantile(timed.perf)
    h = high_quantile(timed.harness) if timed.harness else 0.0
    # Pairs: what this session's re-checks ran (the sequential test may stop early), else the minimum.
    pairs = high_quantile(timed.rechecks) if timed.rechecks else min_pairs
    rate = (len(timed.rechecks) + PRIOR_RECHECKED) / (timed.judged + PRIOR_JUDGED)
    # What this session's re-checks took (they re-measure only the cases in doubt, usually a few of
    # them); before any, every pair as two runs of the whole selection.
    recheck_s = high_quantile(timed.recheck) if timed.recheck else 2 * pairs * p
    return Estimate(correctness_s=c, perf_s=p, harness_s=h, recheck_s=recheck_s, recheck_pairs=pairs,
                    recheck_rate=rate, rechecked=len(timed.rechecks), judged=timed.judged,
                    worst_s=c + p * (1 + 2 * max_pairs) + h)


_CONFIRM_TAG = re.compile(r"-confirm(\d+)-")  # the interleaved re-check's stage tags: <n>-confirm<k>-base|cand


def timed(rows: Sequence[dict]) -> Timed:
    """The stage times the log's rows hold, from their ``timings.stages`` (``[f"{tag}-{stage}", seconds]``).

    An interrupted row's last stage was cut short (a kill, the job's budget): not a duration.
    A try counts as judged when its perf stage ran to the end, and as re-checked by the
    interleaved pairs its stage tags name (``<n>-confirm<k>-base``). Re-check runs are timed
    apart from the perf runs: they may measure only the cases in doubt.
    """
    correctness: list[float] = []
    perf: list[float] = []
    harness: list[float] = []
    recheck_s: list[float] = []
    reference: list[float] = []
    judged, rechecks = 0, []
    for row in rows:
        timings = row.get("timings") or {}
        stages = [(str(n), float(s)) for n, s in timings.get("stages") or ()
                  if isinstance(s, (int, float)) and not isinstance(s, bool)]
        interrupted = was_interrupted(row)
        if interrupted:
            stages = stages[:-1]
        if not stages:
            continue
        correctness += [s for n, s in stages if n.endswith("-correctness")]
        perf += [s for n, s in stages if n.endswith("-perf") and not _CONFIRM_TAG.search(n)]
        reference += [s for n, s in stages if n.endswith("-reference")]
        if isinstance(timings.get("harness_s"), (int, float)):
            harness.append(float(timings["harness_s"]))
        if row.get("iteration", -1) > 0 and not interrupted and any(n.endswith("-perf") for n, _ in stages):
            judged += 1
            pairs = {m.group(1) for n, _ in stages if (m := _CONFIRM_TAG.search(n))}
            if pairs:
                rechecks.append(len(pairs))
                recheck_s.append(sum(s for n, s in stages if _CONFIRM_TAG.search(n)))
    return Timed(tuple(correctness), tuple(perf), tuple(harness), judged, tuple(rechecks), tuple(recheck_s),
                 tuple(reference))


def try_estimate(rows: Sequence[dict], thresholds: Thresholds) -> Estimate | None:
    """How long a ``try`` takes in this session (``estimate`` over ``timed``); None until the log
    has timed a correctness and a perf child (the baseline does)."""
    return estimate(timed(rows), thresholds.min_confirm_pairs, thresholds.max_confirm_pairs)


@dataclass(frozen=True)
class ScreenCost:
    """What ``screen`` spends before it can rank anything, from this session's stage times: each
    candidate's correctness run, then one round (the base's timed run and each candidate's, the
    latter with its reference check)."""

    correctness_s: float
    perf_s: float
    reference_s: float

    def first_ranking_s(self, candidates: int, workers: int = 1) -> float:
        each = math.ceil(candidates / workers)  # a spread screen deals the round's runs to its workers
        return candidates * self.correctness_s + (each + 1) * self.perf_s + each * self.reference_s

    def fitting(self, candidates: int, seconds: float, workers: int = 1) -> int:
        """How many of the candidates (at least one) can be ranked within ``seconds``."""
        k = candidates
        while k > 1 and self.first_ranking_s(k, workers) > seconds:
            k -= 1
        return k


def screen_cost(rows: Sequence[dict]) -> ScreenCost | None:
    """``ScreenCost`` at the high quantile of the log's stage times; a reference check not timed yet
    is priced as a perf run (on TileGym it took 0.5-1.4 of one); None before the baseline."""
    t = timed(rows)
    if not t.correctness or not t.perf:
        return None
    perf = high_quantile(t.perf)
    return ScreenCost(high_quantile(t.correctness), perf, high_quantile(t.reference) if t.reference else perf)


def job_reserve(job_s: float) -> float:
    return max(RESERVE_MIN_S, RESERVE_FRACTION * job_s)


class Budget:
    """The seconds one command may spend from its start (None: unlimited); ``now``: a clock, for tests."""

    def __init__(self, seconds: float | None, now: Callable[[], float] = time.monotonic):
        self.seconds, self._now = seconds, now
        self.start = now()

    @classmethod
    def for_job(cls, budget_s: float | None, job_s: float | None,
                now: Callable[[], float] = time.monotonic) -> Budget:
        """From ``--budget`` and ``--job-seconds``: the job's length less ``job_reserve``, or the
        explicit budget, whichever is smaller."""
        if budget_s is not None and not (math.isfinite(budget_s) and budget_s > 0):
            raise UsageError(f"--budget must be a positive number of seconds, not {budget_s!r}")
        seconds = budget_s
        if job_s is not None:
            if not (math.isfinite(job_s) and job_s > job_reserve(job_s)):
                raise UsageError(f"--job-seconds must be more than {RESERVE_MIN_S:.0f} seconds, not {job_s!r}",
                                 "the job's whole length in seconds, e.g. --job-seconds 600 for a 10-minute job")
            from_job = job_s - job_reserve(job_s)
            seconds = from_job if seconds is None else min(seconds, from_job)
        return cls(seconds, now)

    def elapsed(self) -> float:
        return self._now() - self.start

    def left(self) -> float:
        return math.inf if self.seconds is None else max(self.seconds - self.elapsed(), 0.0)

    def spent(self) -> bool:
        return self.left() <= 0.0

    def fits(self, seconds: float | None) -> bool:
        """Whether that much still fits (nothing measured yet, or no budget: yes)."""
        return seconds is None or seconds <= self.left()

    def cap(self, timeout_s: float) -> float:
        """A child's timeout: the session's, or the budget's end when that comes first."""
        return min(timeout_s, self.left())
