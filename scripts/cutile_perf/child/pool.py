"""The pool of test children: ``run`` a request, and be told what comes next (``expect``).

Every run is a fresh pytest child: runs in one process would share its state (autotuner choices,
allocations), so the interleaved re-check's pairs would not be independent samples. Most of a
fresh child's start-up belongs to no repository, though (the interpreter, torch, cuda.tile, pytest
and the profiler's set-up), so the pool starts the perf runs it was told come next as *spare*
children beside the current run, each parked before any folder of the checkout is on its path
(``child.warmstart``). A parked spare can run nothing of the candidate: it is safe by construction,
with nothing to freeze or inspect. It is used only if the next request is its run; otherwise it is
ended, and the run starts fresh.

A timed (perf) run's first test waits (``runner.Gate``) until every spare waits at its gate, so
nothing works beside a timed test; a spare not parked within ``ready_s`` is ended.
"""
from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cutile_perf.child import groups, runner
from cutile_perf.output import say

# At most this many spares wait at once: the interleaved re-check's runs after its first (2 x
# max_confirm_pairs - 1 by default). Each holds an interpreter with torch imported (about half a GB)
# and nothing of the GPU.
SPARES_AT_ONCE = 5


@dataclass(frozen=True)
class Request:
    """One run of a stage: ``name`` ("correctness" or "perf") of ``commit``, logged under ``tag``;
    ``cases``: only these, ``{case: pytest node id}`` (a re-check run of the cases in doubt);
    ``check``: False, a perf run's timed calls are captured as always but not replayed on the
    reference kernel (``screen``'s rounds after a candidate's first: readings, never verdicts)."""

    name: str
    tag: str
    commit: str
    cases: dict[str, str | None] | None = None
    check: bool = True

    @property
    def select(self) -> list[str] | None:
        """The node ids to run alone (``measure.run_stage``'s ``select``), or None: the whole selection."""
        cases = self.cases
        return sorted(set(cases.values())) if cases and all(cases.values()) else None

    def same_run(self, other: Request) -> bool:
        """Whether a spare started for this request serves ``other``: the same stage, tag and commit.
        The cases may differ: they are handed over when it is let go (``handover``)."""
        return (self.name, self.tag, self.commit) == (other.name, other.tag, other.commit)

    def handover(self) -> bytes:
        """What a spare is told when it is let go for this request: its node ids, or nothing."""
        select = self.select
        return json.dumps(select).encode() if select else b""


# Builds what runs ``request``'s child (in the caller's thread: checkouts are built there), given
# the gate its first test waits on, the start gate of a spare (None: a fresh child) and what to
# call with each process group it starts.
Launch = Callable[[Request], Callable[[runner.Gate | None, runner.StartGate | None, Callable[[int], None]], Any]]


@dataclass
class _Child:
    """A child run in a worker thread: its request, its gates, its process groups."""

    request: Request
    gate: runner.Gate  # its first test waits here
    start: runner.StartGate | None  # a spare: it waits here before any code of the repository
    groups: list[int] = field(default_factory=list)
    future: Future | None = None
    cancelled: bool = False  # a process that starts from now on is ended at once
    finished: bool = False  # its start gate's ready pipe is closed


class Pool:
    """Runs requests; starts the ones it was told come next as spares (module docstring)."""

    def __init__(self, launch: Launch, may_park: Callable[[Request], bool], ready_s: Callable[[], float],
                 on_start: Callable[[int], None] | None = None):
        """``may_park(request)``: whether that run may start as a spare here. ``ready_s()``: how long
        a timed run waits for the spares to park. ``on_start(pgid)``: each process group started."""
        self._launch, self._may_park, self._ready_s, self._on_start = launch, may_park, ready_s, on_start
        self._upcoming: tuple[Request, ...] = ()
        self._spares: list[_Child] = []  # in the order they will be asked for
        self._children: list[_Child] = []  # every child run in a worker thread, for ``close``
        self._workers = ThreadPoolExecutor(max_workers=SPARES_AT_ONCE + 1, thread_name_prefix="cutile-perf-child")

    def expect(self, requests: Sequence[Request]) -> None:
        """Be told the runs that follow the next ``run``, in order, as far as the caller can tell."""
        self._upcoming = tuple(requests)

    def run(self, request: Request) -> Any:
        """Run ``request``'s child: its spare if one is parked for it, else a fresh one. The spares
        for what was expected start beside it; a perf run's first test waits until they are parked."""
        spare = self._take(request)
        self._park(self._upcoming)
        self._upcoming = ()
        if request.name != "perf" and spare is None:  # not timed: nothing waits, nothing to hand over
            return self._launch(request)(None, None, self._started_by(None))
        child = spare
        if child is not None and not child.start.open(request.handover()):  # it died while it waited
            self._end(child)
            child = None
        if child is None:
            child = self._submit(request, start=None)
        try:
            self._settle()
            child.gate.open()
            result = child.future.result()
        except BaseException:  # Ctrl-C or a signal: the child runs in a worker thread, so end it here
            self._end(child)
            raise
        self._finish(child)
        return result

    def close(self) -> None:
        """End every child still running or waiting; none outlives the pool."""
        self._spares = []
        for child in self._children:
            if not child.finished:
                self._end(child)
        self._children.clear()
        self._workers.shutdown(wait=True)

    # -- the spares ---------------------------------------------------------------------------------

    def _take(self, request: Request) -> _Child | None:
        """The first spare, if it is parked for ``request`` and still alive; the others stay for
        ``_park`` to keep or end."""
        if not self._spares or not self._spares[0].request.same_run(request):
            return None
        spare = self._spares.pop(0)
        if spare.future.done():  # it crashed while it imported: no run of ``request``
            self._end(spare)
            return None
        return spare

    def _park(self, upcoming: Sequence[Request]) -> None:
        """Make the spares the first of ``upcoming`` (up to the first that may not park, at most
        ``SPARES_AT_ONCE``): keep those already parked for them, end the others, start the rest."""
        wanted: list[Request] = []
        for request in upcoming[:SPARES_AT_ONCE]:
            if not self._may_park(request):
                break
            wanted.append(request)
        kept = 0
        for spare, request in zip(self._spares, wanted):
            if not spare.request.same_run(request):
                break
            kept += 1
        for spare in self._spares[kept:]:
            self._end(spare)
        # Started for the whole selection: the cases are handed over when it is let go.
        self._spares[kept:] = [self._submit(Request(r.name, r.tag, r.commit), start=runner.StartGate())
                               for r in wanted[kept:]]

    def _settle(self) -> None:
        """Return once every spare waits at its gate (or has ended); one not parked in time is
        ended with all after it (their runs will start fresh)."""
        end_by = time.monotonic() + self._ready_s()  # one window: they started together and import side by side
        for index, spare in enumerate(self._spares):
            if not spare.start.wait_ready(max(end_by - time.monotonic(), 0.0), ended=spare.future.done):
                say(f"{spare.request.tag}: the spare child was not parked in time; it is ended and its run "
                    "will start fresh")
                for late in self._spares[index:]:
                    self._end(late)
                del self._spares[index:]
                return

    # -- one child ----------------------------------------------------------------------------------

    def _submit(self, request: Request, start: runner.StartGate | None) -> _Child:
        child = _Child(request, runner.Gate(), start)
        self._children.append(child)  # before it exists: an interrupt from here on still ends it (close)
        job = self._launch(request)
        child.future = self._workers.submit(job, child.gate, start, self._started_by(child))
        return child

    def _started_by(self, child: _Child | None) -> Callable[[int], None]:
        def started(pgid: int) -> None:
            if child is not None:
                child.groups.append(pgid)
            if self._on_start is not None:
                self._on_start(pgid)
            if child is not None and child.cancelled:  # ended before its process existed
                groups.end_group(pgid)
        return started

    def _end(self, child: _Child) -> None:
        """Cancel ``child`` wherever it is (waiting at a gate or running), end its process groups and
        wait for its worker thread; what it measured is no evidence of anything and is never read."""
        child.cancelled = True
        for gate in (child.start, child.gate):
            if gate is not None:
                gate.close()
        if child.future is not None and not child.future.done():  # an ended child's group id may be reused
            for pgid in child.groups:
                groups.end_group(pgid)
        if child.future is not None:
            with contextlib.suppress(Exception):  # a second Ctrl-C still interrupts the wait
                child.future.result()
        self._finish(child)

    @staticmethod
    def _finish(child: _Child) -> None:
        if not child.finished and child.start is not None:
            child.start.done()
        child.finished = True
