"""How long a ``try`` takes, from what this session measured, and the time one GPU job gives it.

``estimate`` is a pure rule over the stage times the log holds (``timed`` reads them out of the
rows' ``timings``); ``Budget`` is the job's clock. ``batch`` and ``try --job-seconds`` start
a try only when a typical one fits what is left, cap every child's timeout at the budget's end,
and settle a try that the end cuts short as ``interrupted`` (``BudgetSpent``): no verdict, the
change kept in its patch, the next job tries it again. A re-check that cannot end within what is
left even at its floor (``recheck_floor_s``) is not started: the try is settled as interrupted at
once, and a batch goes on with the entries after it while a typical try still fits.

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
        if isinstance(timings.get("harness_s"), (int, float)):
            harness.append(float(timings["harness_s"]))
        if row.get("iteration", -1) > 0 and not interrupted and any(n.endswith("-perf") for n, _ in stages):
            judged += 1
            pairs = {m.group(1) for n, _ in stages if (m := _CONFIRM_TAG.search(n))}
            if pairs:
                rechecks.append(len(pairs))
                recheck_s.append(sum(s for n, s in stages if _CONFIRM_TAG.search(n)))
    return Timed(tuple(correctness), tuple(perf), tuple(harness), judged, tuple(rechecks), tuple(recheck_s))


def try_estimate(rows: Sequence[dict], thresholds: Thresholds) -> Estimate | None:
    """How long a ``try`` takes in this session (``estimate`` over ``timed``); None until the log
    has timed a correctness and a perf child (the baseline does)."""
    return estimate(timed(rows), thresholds.min_confirm_pairs, thresholds.max_confirm_pairs)


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
