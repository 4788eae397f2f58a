"""What runs an iteration's test stages: one protocol, the real runner and a scripted one for tests.

``Iteration`` asks a ``Stages`` object for each stage (correctness, perf, the interleaved re-check
runs) and never learns how it was run. ``StageRunner`` runs pytest children in pristine checkouts
built from the commits (``child.pristine``, ``child.measure``); ``ScriptedStages`` returns stages a
test wrote down in advance, so the loop's unit tests run in milliseconds without a child process
(the way Kernel Tuner's simulation runner stands in for a GPU).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from cutile_perf.child import bytecode, freezer, measure, pristine, runner, warmstart
from cutile_perf.errors import IterationCrashed
from cutile_perf.judge.verdict import Stage
from cutile_perf.output import say
from cutile_perf.store import git_ops, jitcache
from cutile_perf.store.history import History
from cutile_perf.store.session import Session


AHEAD_READY_S = 60.0  # how long a run's first test waits for the children started ahead to be ready
# At most this many children wait ahead of their turn at once: the interleaved re-check's runs
# (2 x max_confirm_pairs by default). Each holds an interpreter with torch imported (about half a
# GB) and nothing of the GPU.
AHEAD_AT_ONCE = 6
# The re-check's runs start speculatively, with the candidate's correctness run, only on a machine
# with at least this many CPUs: six children import torch beside the correctness child and the held
# perf child (one CPU each), and on fewer CPUs they would slow those two down for a re-check that
# most tries never run.
SPECULATIVE_MIN_CPUS = 8
# How long a killed child that held the GPU may take to exit before no run can be timed any more.
GONE_S = 30.0


@dataclass(frozen=True)
class NextRun:
    """A run the loop may ask for next: started ahead of its turn, it is used only if the next
    request is this very run (same stage, tag, commit and cases); otherwise it is cancelled.

    ``speculative``: started before the loop knows whether it will ask for it, or for which cases:
    the interleaved re-check's runs, started with the candidate's correctness run
    (``Stages.correctness_then_perf``). It takes a request for any cases, which are handed over when
    it is let go, and it is frozen (SIGSTOP) rather than waited for when a run must be timed before
    it is ready."""

    name: str
    tag: str
    commit: str
    cases: dict[str, str | None] | None = None
    speculative: bool = False

    @property
    def select(self) -> list[str] | None:
        """The node ids to run alone (``measure.run_stage``'s ``select``), or None: the whole selection."""
        cases = self.cases
        return sorted(set(cases.values())) if cases and all(cases.values()) else None

    def takes(self, request: NextRun) -> bool:
        """Whether a child started for this run can serve ``request``."""
        if self.speculative:
            return (self.name, self.tag, self.commit) == (request.name, request.tag, request.commit)
        return self == request

    def handover(self, request: NextRun) -> bytes:
        """What a child started for this run is told when it is let go for ``request``: the node ids
        of a speculative run (it started without them), nothing otherwise."""
        select = request.select if self.speculative else None
        return json.dumps(select).encode() if select else b""


@dataclass
class _Child:
    """A perf child running in a worker thread: its gates, its checkout, its process groups."""

    run: NextRun
    checkout: Any
    tests: Any  # runner.Gate: its first test waits on it
    start: Any  # runner.StartGate when it was started ahead of its turn
    groups: list[int] = field(default_factory=list)
    future: Any = None
    ended: bool = False  # ``_end`` ran (its ready pipe is closed)
    cancelled: bool = False  # ``_end`` began: a process that starts now is killed at once
    frozen: bool = False  # stopped (SIGSTOP) while a run is timed; a process that starts now is stopped at once
    handover: bytes = b""  # what it is told when let go (``NextRun.handover``)
    stopped: set[int] = field(default_factory=set)  # collected ahead: its whole process tree, stopped while a run is timed

    @property
    def collected(self) -> bool:
        """Collected ahead of its turn: held at its tests gate, which says when it waits there."""
        return self.start is None and self.tests.ready is not None

    @property
    def waits(self):
        """What says whether it waits at the gate that holds it (``runner.ReadyPipe`` or ``StartGate``)."""
        return self.tests.ready if self.collected else self.start


def _signal_groups(child: _Child, signum: int) -> None:
    for pgid in child.groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)
    if signum == signal.SIGSTOP:  # it lands when each thread next enters the kernel: wait for that
        freezer.wait_stopped(set().union(*(freezer.process_tree(g) for g in child.groups)), freezer.STOP_SETTLE_S)


def _end(child: _Child) -> None:
    """Cancel ``child`` wherever it is (waiting at a gate or running), kill its process groups and
    wait for its worker thread; what it measured is no evidence of anything and is never read."""
    child.cancelled = True
    for gate in (child.start, child.tests):
        if gate is not None:
            gate.close()
    if child.future is None or not child.future.done():  # an ended child's group id may be reused
        _signal_groups(child, signal.SIGKILL)  # a frozen one too: SIGKILL needs no SIGCONT
    if child.future is not None:
        with contextlib.suppress(Exception):  # a second Ctrl-C still interrupts the wait
            child.future.result()
    if child.waits is not None and not child.ended:
        child.waits.done()
    child.ended = True


def may_prestart(stages: Stages, session: Session) -> tuple[bool, str | None]:
    """``(go, why_not)``: whether the perf child starts together with the correctness run
    (``Stages.correctness_then_perf``), and why not when the session asks for it but this runner
    refuses (``prestart_refusal``); ``why_not`` is None when it goes or was not asked for."""
    why_not = stages.prestart_refusal() if session.prestart_perf else None
    return bool(session.prestart_perf) and why_not is None, why_not


class Stages(Protocol):
    """Runs one iteration's stages; a context manager around all of them."""

    clock: Any  # the command's ``iteration.Clock``: each stage's duration goes into the row's timings

    def stage(self, name: str, tag: str, commit: str, cases: dict[str, str | None] | None = None,
              then: Sequence[NextRun] = ()) -> Stage: ...

    def correctness_then_perf(self, tag: str, commit: str, proceed: Callable[[Stage], bool],
                              perf_tag: str | None = None, then: Sequence[NextRun] = (),
                              speculative: Sequence[NextRun] = ()) -> tuple[Stage, Stage | None]: ...

    def prestart_refusal(self) -> str | None: ...

    def defined_names(self, commit: str) -> set[str]: ...

    def row_fields(self) -> dict: ...

    def __enter__(self) -> Stages: ...

    def __exit__(self, *exc) -> None: ...


class StageRunner:
    """Runs test stages in pristine checkouts of commits (one checkout per commit, built once).

    Protected paths always come from the session's base commit, fenced paths from the commit asked
    for: the baseline, every candidate, the interleaved re-check and ``verify`` all measure this way.
    """

    def __init__(self, session: Session, g, deadline, clock: Clock, on_start=None, fresh_compile_cache: bool = False,
                 preload: Sequence[str] = (), collect_refusal: str | None = None):
        """``fresh_compile_cache``: compile everything in an empty cache of this runner's own
        (``verify``) instead of the session's guarded one; only with ``jit_cache`` on. ``preload``:
        the installed modules every child started ahead of its turn imports while it waits (the
        baseline row's ``preload``, ``History.preload``). ``collect_refusal``: why no child collects
        ahead of its turn here, learnt by an earlier command (``History.collect_refusal``)."""
        from cutile_perf.child import measure# noqa: PLC0415 - measure imports session, not iteration

        self.measure = measure
        self.session, self.g, self.deadline, self.clock, self.on_start = session, g, deadline, clock, on_start
        self.tracked = git_ops.tracked_files(g)
        self.checkouts: dict = {}
        self.fenced: dict[str, list[str]] = {}
        self.fresh_compile_cache = fresh_compile_cache
        self.preload = tuple(preload)
        self.compile_cache: Path | None = None  # set on entry when the session keeps a JIT cache
        # Set on entry for boxed children (child.bytecode); what the row says of it, when notable.
        self.installed_bytecode: Path | None = None
        self._bytecode_note: dict = {}
        self._filling: tuple | None = None  # (began, pool, future): its preloads, compiled beside the first children
        self.dropped_compiled: list[str] = []  # cache entries no earlier command recorded, dropped on entry
        self._exits = contextlib.ExitStack()
        # The perf children started ahead of their turn (``stage``'s ``then``), in the order they
        # will be asked for: only the first may be claimed, and one asked for out of order is ended.
        self._ahead: list[_Child] = []
        self._children: list[_Child] = []  # every child run in a worker thread, for ``close``
        self._pool = ThreadPoolExecutor(max_workers=AHEAD_AT_ONCE + 1, thread_name_prefix="cutile-perf-child")
        self._collect_refusal = collect_refusal  # set once a child collected ahead held the GPU
        self._collect_refused_here: str | None = None  # ... in this runner: its row says so
        self._ahead_serial = itertools.count(1)  # every child collected ahead gets a new checkout
        self._slots = itertools.count()

    def fenced_files(self, commit: str) -> list[str]:
        # Asked for by every stage of a commit: list its tree once.
        if commit not in self.fenced:
            self.fenced[commit] = [e.path for e in git_ops.tree_entries(self.g, commit) if self.session.fenced(e.path)]
        return self.fenced[commit]

    def checkout(self, commit: str, held: bool | str = False):
        """The checkout of ``commit``, built once; ``held``: a second one of its own for the perf
        child held during the correctness run (``correctness_then_perf``), or a name for one of a
        child collected ahead of its turn (``_launch_ahead``)."""
        from cutile_perf.child import pristine# noqa: PLC0415

        key = (commit, held)
        if key not in self.checkouts:
            # With the JIT cache, the n-th checkout of every command has the same path (the cache
            # keys embed it); without it, a fresh random one as always.
            slot = pristine.slot_root(self.session.repo, next(self._slots)) if self.compile_cache else None
            built = pristine.build(self.g, protected_from=self.session.base_commit, fenced_from=commit,
                                   fence=self.session.fence, root=slot)
            self.checkouts[key] = replace(built, compile_cache=self.compile_cache,
                                          installed_bytecode=self.installed_bytecode)
        return self.checkouts[key]

    def prestart_refusal(self) -> str | None:
        """Why the perf child may not start during the correctness run here, or None. Two children
        of the candidate at once are kept apart by the box alone (each sees its own checkout and
        nothing of the other's): unboxed, either could find the other's checkout and change what
        it reads (a test file loosened for the correctness run and put back when it ends)."""
        why = measure.box_why_not(self.session)
        return f"its children run without the sandbox ({why})" if why else None

    def stage(self, name: str, tag: str, commit: str, cases: dict[str, str | None] | None = None,
              session: Session | None = None, then: Sequence[NextRun] = ()):
        """``cases``: only these cases, ``{case: pytest node id}`` (the interleaved re-check's cases
        in doubt); the child runs their node ids alone (``measure.run_stage``'s ``select``), or the
        whole selection when a case has no node id. ``session``: another command set for this one
        stage (``verify --full-tests``); the checkouts, fence and protected files stay the runner's.
        ``then``: the runs the caller will ask for next, in order, unless the judge's verdict is
        final first; they are started ahead of their turn (``ahead_refusal``, at most
        ``AHEAD_AT_ONCE``): collected ahead, and stopped with their whole process tree before a
        perf run's first test (``_stop_collected``), or else held before any code of the repository
        (``child.warmstart``), and then a perf run's first test waits until each of them waits.

        Every run is a fresh child, and no other child does anything while it times: see
        ``correctness_then_perf`` for the one overlap of two working children that is safe."""
        run = NextRun(name, tag, commit, cases)
        self._thaw_ahead()  # frozen while the run before this one was timed
        if session is not None:  # another command: nothing started ahead runs it, nor is started for it
            self._cancel_ahead()
            current, then = None, ()
        else:
            current = self._claim_ahead(run)
        new = self._start_ahead(then)
        # A fresh perf child starts beside the new ones and its first test waits for them (their
        # imports overlap its start-up); any other fresh run just runs (it is not timed).
        if current is None and (not new or name != "perf"):
            if name == "perf":
                self._settle_ahead()
            result = measure.run_stage(session or self.session, name, tag, self.deadline,
                                       checkout=self.checkout(commit), fenced_files=self.fenced_files(commit),
                                       tracked=self.tracked, on_start=self.on_start, select=run.select)
        else:
            waited = 0.0
            try:
                if current is not None and current.collected:
                    # Its collection may not be over (it was stopped while the run before was timed):
                    # what is left of it counts in this run's time.
                    began = time.monotonic()
                    ready = current.waits.wait_ready(min(AHEAD_READY_S, max(self.deadline.left(), 0.0)),
                                                     ended=current.future.done)
                    waited = time.monotonic() - began
                    if not ready or current.future.done():
                        say(f"{tag}: the child collected ahead of its turn "
                            f"{'ended' if ready else 'had not collected in time'}; it starts fresh")
                        _end(current)
                        current = None
                elif current is not None and not current.start.open(current.handover):  # it died while it waited
                    _end(current)
                    current = None
                if current is None:
                    current = self._launch(run, self.checkout(commit), start=None)
                if name == "perf":
                    self._settle_ahead()
                # Nothing else runs any more: the children ahead wait, or are stopped.
                current.tests.open(current.handover if current.collected else b"")
                result = current.future.result()
            except BaseException:  # Ctrl-C or a signal: the child runs in a worker thread, so end it here
                if current is not None:
                    _end(current)
                raise
            if current.waits is not None:
                current.waits.done()
            current.ended = True
            result = replace(result, duration_s=result.duration_s + waited)
        self.clock.add_child(result.duration_s, f"{tag}-{name}")
        if name == "perf":
            result = self.check_timed_calls(result, commit, tag)
        return replace(result, cases=tuple(sorted(cases))) if cases else result

    def check_reference(self) -> str | None:
        """The commit whose kernel checks the timed calls (``child.checkrun``): the current baseline;
        None before there is one (the baseline's own runs are not checked against themselves)."""
        if not hasattr(self, "_check_reference"):
            ref = History.open(self.session, self.g, strict=False).reference()
            self._check_reference = ref.commit if ref is not None else None
        return self._check_reference

    def check_timed_calls(self, stage, commit: str, tag: str):
        """A perf run of any commit but the reference, with its timed calls checked against the
        reference's kernel in a child of its own (``child.checkrun``)."""
        from cutile_perf.child import checkrun  # noqa: PLC0415

        if not getattr(stage, "checked", ()) or not stage.ok:
            return stage
        reference = self.check_reference()
        if reference is None or reference == commit:
            return stage
        checkout, fenced = self.checkout(reference), self.fenced_files(reference)

        def run_child(select, extra_env, private, output):
            result, report, _file = measure._run_child(self.session, "perf", self.deadline, checkout, fenced, None,
                                                       output, private, select=select, extra_env=extra_env)
            self.clock.add_child(result.duration_s, f"{tag}-reference")
            return report

        return checkrun.check_stage(self.session, stage, run_child=run_child, tag=tag)

    def ahead_refusal(self, run: NextRun) -> str | None:
        """Why ``run`` may not start ahead of its turn here, or None. Only a perf run, only in the
        box (the running child must not find the waiting one's checkout, nor its process: the box
        has its own file view and process namespace), only where the session pre-starts at all
        (``prestart_perf``), and only a ``python -m pytest`` command (``child.warmstart``)."""
        if run.name != "perf":
            return "only perf runs start ahead of their turn"
        if not self.session.prestart_perf:
            return "session.yaml has prestart_perf: false"
        if warmstart.warm_argv(self.session.argv("perf")) is None:
            return "the perf command is not '{python} -m pytest ...'"
        return self.prestart_refusal()

    def _start_ahead(self, then: Sequence[NextRun]) -> list[_Child]:
        """Make the children waiting ahead of their turn the first of ``then`` (up to the first one
        refused, at most ``AHEAD_AT_ONCE``): end those no longer wanted, start the missing ones and
        return them (not yet ready: ``_settle_ahead``).

        A child started ahead runs in its commit's one checkout even while that commit's previous
        run is still in it: it reads nothing there until let go, and the checkout is swept for it
        then (``measure.run_stage``)."""
        wanted = list(itertools.islice(itertools.takewhile(lambda r: self.ahead_refusal(r) is None, then),
                                       AHEAD_AT_ONCE))
        kept = 0
        for child, run in zip(self._ahead, wanted):
            if not child.run.takes(run):
                break
            kept += 1
        for child in self._ahead[kept:]:
            _end(child)
        del self._ahead[kept:]
        new = [self._launch_ahead(run) for run in wanted[kept:]]
        self._ahead.extend(new)
        return new

    def collect_refusal(self) -> str | None:
        """Why a child started ahead of its turn may not collect ahead of it here, or None. It then
        waits before any code of the repository (``child.warmstart``) and collects after its gate."""
        if not self.session.collect_ahead:
            return "session.yaml has collect_ahead: false"
        return self._collect_refusal

    def _launch_ahead(self, run: NextRun) -> _Child:
        """Start ``run``'s child ahead of its turn: collected ahead, held at its tests gate in a
        checkout of its own (no other child, not even its commit's run before it, writes what it
        collects), or else held before any code of the repository (``child.warmstart``)."""
        if self.collect_refusal() is None:
            home = self.checkout(run.commit, held=f"{run.tag} ahead #{next(self._ahead_serial)}")
            return self._launch(run, home, start=None, collect=True)
        return self._launch(run, self.checkout(run.commit), start=runner.StartGate())

    def _stop_collected(self) -> None:
        """Before a run is timed: stop the whole process tree of every child collected ahead of its
        turn, and end any of them that holds a CUDA context (``child.freezer``: the driver's list,
        a ``/dev/nvidia-uvm`` mapping); a stopped tree without one runs nothing beside the timed
        run. After one held it, the children started later wait before any code of the repository
        instead."""
        waiting = [c for c in self._ahead if c.collected and not c.future.done()]
        for child in waiting:
            if not child.groups:  # no process yet: ``_launch`` stops it as soon as it exists
                child.frozen = True
        waiting = [c for c in waiting if c.groups]
        if not waiting:
            return
        trees = freezer.stop_trees([c.groups[0] for c in waiting])
        listed = freezer.compute_pids()  # asked once every tree is stopped: none can make a context after it
        for child in waiting:
            child.stopped |= trees[child.groups[0]]
            held = freezer.gpu_holders(child.stopped, listed)
            if held:
                signs = sorted({sign for found in held.values() for sign in found})
                say(f"{child.run.tag}: the child collected ahead of its turn held the GPU before its turn "
                    f"({', '.join(signs)}); it is ended and will start fresh, and later children start "
                    "ahead without collecting")
                self._collect_refusal = self._collect_refused_here = (
                    f"a child collected ahead of its turn held the GPU before its turn ({', '.join(signs)})")
                _end(child)
                self._ahead.remove(child)
                # Its context (and any work it queued) ends only once its processes have exited.
                if not freezer.wait_gone(child.stopped, GONE_S):
                    raise IterationCrashed(f"{child.run.tag}: a child that held the GPU was still running "
                                           f"{GONE_S:.0f} s after it was killed; nothing is timed beside it",
                                           "see what runs on the GPU (nvidia-smi), then run the command again")

    def _settle_ahead(self, freeze_speculative: bool = False) -> None:
        """Return once every child started ahead waits at its gate (or has ended); one not ready in
        time is stopped with all after it (they will start fresh). ``freeze_speculative``: a
        speculative child (``NextRun.speculative``) that is not ready now is frozen instead of
        waited for (SIGSTOP: it runs nothing beside the timed run; ``_thaw_ahead`` lets it go on)."""
        self._finish_filling()  # no process of ours compiles beside a timed run
        self._stop_collected()
        if freeze_speculative:
            for child in self._ahead:
                if child.collected:
                    continue
                if child.run.speculative and not child.start.ready_now() and not child.future.done():
                    child.frozen = True
                    _signal_groups(child, signal.SIGSTOP)
        # One window for all of them: they started together and import side by side.
        end_by = time.monotonic() + min(AHEAD_READY_S, max(self.deadline.left(), 0.0))
        for index, child in enumerate(self._ahead):
            if child.frozen or child.collected:
                continue
            if not child.start.wait_ready(max(end_by - time.monotonic(), 0.0), ended=child.future.done):
                say(f"{child.run.tag}: the child started ahead of its turn was not ready in time; it is stopped "
                    "and will start fresh")
                for late in self._ahead[index:]:
                    _end(late)
                del self._ahead[index:]
                return

    def _thaw_ahead(self) -> None:
        """Let every frozen or stopped child go on with its start-up (``_settle_ahead``)."""
        for child in self._ahead:
            if child.stopped:
                freezer.continue_tree(child.stopped)
                child.stopped = set()
            if child.frozen:
                child.frozen = False
                _signal_groups(child, signal.SIGCONT)

    def speculation_refusal(self) -> str | None:
        """Why the re-check's runs may not start speculatively with the candidate's correctness run
        here (``SPECULATIVE_MIN_CPUS``), or None."""
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if cpus < SPECULATIVE_MIN_CPUS:
            return f"{cpus} CPUs (fewer than {SPECULATIVE_MIN_CPUS})"
        return None

    def _launch(self, run: NextRun, checkout, start: runner.StartGate | None, collect: bool = False) -> _Child:
        """Start ``run``'s child in ``checkout``; its first test waits on the returned child's ``tests``
        gate (timed from its start, or from ``start``'s opening when given; ``collect``: collected
        ahead of its turn, timed from the gate's opening, and it says when it waits there)."""
        tests = runner.Gate(hides_start_up=collect, announces=collect)
        child = _Child(run, checkout, tests, start)
        self._children.append(child)  # before it exists: an interrupt from here on still ends it (close)

        def started(pgid: int) -> None:
            child.groups.append(pgid)
            if self.on_start is not None:
                self.on_start(pgid)
            if child.cancelled:  # cancelled before its process existed
                _signal_groups(child, signal.SIGKILL)
            elif child.frozen:  # frozen before its process existed
                _signal_groups(child, signal.SIGSTOP)

        child.future = self._pool.submit(
            measure.run_stage, self.session, run.name, run.tag, self.deadline, checkout=checkout,
            fenced_files=self.fenced_files(run.commit), tracked=self.tracked, on_start=started, gate=tests,
            select=run.select, start=start, preload=self.preload)
        return child

    def _claim_ahead(self, run: NextRun) -> _Child | None:
        """The child started ahead for ``run``, if it is the first one waiting; the others stay for
        ``_start_ahead`` to keep or end. One that ended before it was let go (it crashed while
        importing) is no run of ``run``'s: dropped."""
        if not self._ahead or not self._ahead[0].run.takes(run):
            return None
        ahead = self._ahead.pop(0)
        if ahead.future.done():
            _end(ahead)
            return None
        ahead.handover = ahead.run.handover(run)
        return ahead

    def _cancel_ahead(self) -> None:
        ahead, self._ahead = self._ahead, []
        for child in ahead:
            _end(child)

    def correctness_then_perf(self, tag: str, commit: str, proceed: Callable[[Any], bool],
                              perf_tag: str | None = None, then: Sequence[NextRun] = (),
                              speculative: Sequence[NextRun] = ()):
        """Correctness, then perf, of ``commit``, with the perf child started at once and held
        before its first test (``runner.Gate``): its start-up (interpreter, torch, imports,
        collection, the profiler's set-up) overlaps the correctness run. ``proceed(correctness_stage)``
        says whether to let it run; if not, it is killed. Returns ``(correctness, perf or None)``;
        ``perf_tag``: the perf run's tag when it is not ``tag`` (the baseline's first perf run).
        ``then``: the perf runs asked for after this one (the baseline's later runs), started ahead
        of their turn with the correctness run (``stage``); the perf run's first test waits until
        each of them waits. ``speculative``: the runs that may be asked for after this one (the
        interleaved re-check's, ``NextRun.speculative``), started with the correctness run too where
        the machine has CPUs to spare (``speculation_refusal``). The perf run does not wait for
        them: those not ready when its first test starts are frozen until the next request.

        Only start-up overlaps: no perf test starts before the correctness child has ended. Each
        stage still snapshots the protected files before its child starts and compares them after
        it ends, so the two windows together cover everything from the first start to the last end.
        The two children never share a writable folder: the perf child runs in a checkout of its
        own, and each runs in its box (``prestart_refusal``), so neither can change a file the
        other reads and put it back before its own stage's check.

        This child is held after it has collected (run code of the repository) beside the
        correctness run only, which is not timed, and it may hold a CUDA context. Children started
        ahead of their turn (``then``) and collected ahead are not trusted to sit still beside a
        *timed* run: the candidate's code has run at import and could load the CPU or the GPU while
        the baseline is timed, and even an idle child holding a CUDA context is a neighbour the
        baseline was not measured beside. So before a perf run's first test their whole process
        trees are stopped, and any that maps a GPU device file is ended (``_stop_collected``,
        ``child.freezer``); those held before any code of the repository hold only an interpreter
        with torch, cuda.tile and pytest imported. Nor does a perf child run a second time for the interleaved re-check:
        runs in one process share its state (autotuner choices, allocations), so the pairs would not
        be independent samples, and the candidate's perf run is the one that chose the cases in
        doubt, whose luck a re-run in its process would carry into the pairs. What the re-check's
        children do reuse is each commit's checkout and the session's compile cache.
        """
        from cutile_perf.child import runner# noqa: PLC0415

        gate = runner.Gate()
        perf_groups: list[int] = []

        def perf_started(pgid: int) -> None:
            perf_groups.append(pgid)
            if self.on_start is not None:
                self.on_start(pgid)

        perf_tag = perf_tag or tag
        checkout, fenced = self.checkout(commit, held=True), self.fenced_files(commit)
        self.checkout(commit)  # the correctness child's, built before either child starts
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(measure.run_stage, self.session, "perf", perf_tag, self.deadline, checkout=checkout,
                                  fenced_files=fenced, tracked=self.tracked, on_start=perf_started, gate=gate)
            try:
                ahead = [*then, *(speculative if self.speculation_refusal() is None else ())]
                correctness = self.stage("correctness", tag, commit, then=ahead)
                go = proceed(correctness)
                if go:
                    self._settle_ahead(freeze_speculative=True)
                else:
                    self._cancel_ahead()  # no perf run, so no run after it either
            except BaseException:
                go = False
                raise
            finally:
                if go:
                    gate.open()
                else:
                    gate.close()
                    for pgid in perf_groups:  # do not wait for it to finish collecting
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(pgid, signal.SIGKILL)
            perf = pending.result()
        if not go:
            return correctness, None
        self.clock.add_child(perf.duration_s, f"{perf_tag}-perf")
        return correctness, self.check_timed_calls(perf, commit, perf_tag)

    def row_fields(self) -> dict:
        """What a baseline or try row says of this runner, on the record a reviewer reads and not only
        on stderr: the unrecorded compiled kernels it dropped, and that a child collected ahead of
        its turn held the GPU (which later commands believe, ``History.collect_refusal``)."""
        fields: dict = {"compile_cache_dropped": len(self.dropped_compiled)} if self.dropped_compiled else {}
        if self._collect_refused_here:  # later commands start children ahead without collecting
            fields["collect_ahead_refused"] = self._collect_refused_here
        return {**fields, **self._bytecode_note}

    def defined_names(self, commit: str) -> set[str]:
        return measure.defined_names(self.checkout(commit).root, self.fenced_files(commit))

    def close(self) -> None:
        try:
            self._finish_filling()
            self._ahead = []
            for child in self._children:  # an interrupt can leave one running: none outlives the runner
                if not child.ended:
                    _end(child)
            self._children.clear()
            self._pool.shutdown(wait=True)
            for checkout in self.checkouts.values():
                checkout.remove()
            self.checkouts.clear()
        finally:
            self._exits.close()  # records the session cache: every child of this command has ended

    def __enter__(self) -> StageRunner:
        from cutile_perf.store import jitcache# noqa: PLC0415

        # ``verify`` (a fresh compile cache) trusts nothing it did not build from the commits: its
        # children compile installed code themselves too, so a .pyc planted in the shared folder by
        # a process outside any box is not what verify runs.
        if measure.box_why_not(self.session) is None and not self.fresh_compile_cache:
            self._prepare_installed_bytecode()
        if self.session.jit_cache:
            if self.fresh_compile_cache:
                self.compile_cache = self._exits.enter_context(jitcache.fresh_dir())
            else:
                self.compile_cache = jitcache.session_dir(self.session.sandbox)
                dropped = self.dropped_compiled = self._exits.enter_context(jitcache.guarded(self.compile_cache))
                if dropped:
                    say(f"warning: dropped {len(dropped)} compiled kernel(s) from {self.compile_cache} that no "
                        "cutile-perf command recorded (written by something else, changed since, or left by a "
                        "killed command); they are compiled again from the commits")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _prepare_installed_bytecode(self) -> None:
        """The installed-code bytecode every boxed child of this command reads (``child.bytecode``):
        the modules every child imports first, and those the baseline's perf runs imported besides
        (``preload``). Compiled before the first child starts when the first ones are missing; when
        only preloads are (the first ``try`` after a baseline), the folder is used as it is and the
        rest is compiled beside the first, untimed, children, and waited for before any run is
        timed (``_settle_ahead``)."""
        modules = (*warmstart.WARM_MODULES, *self.preload)
        began = time.monotonic()
        partial = bytecode.partly_filled(warmstart.WARM_MODULES, modules)
        if partial is not None:
            self.installed_bytecode = partial
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cutile-perf-bytecode")
            self._filling = (began, pool, pool.submit(bytecode.prepare, modules))
            return
        self.installed_bytecode, why = bytecode.prepare(modules)
        self._note_bytecode(began, self.installed_bytecode, why)

    def _finish_filling(self) -> None:
        if self._filling is None:
            return
        began, pool, pending = self._filling
        self._filling = None
        prefix, why = pending.result()
        pool.shutdown(wait=False)
        # Failed, the children still read what was there before: only the preloads compile from source.
        self._note_bytecode(began, prefix, why, missing="the baseline's preloads")

    def _note_bytecode(self, began: float, prefix: Path | None, why: str, missing: str = "installed code") -> None:
        if prefix is None:
            self._bytecode_note = {"installed_bytecode": why}
            say(f"note: boxed children compile {missing} from source: {why}")
        elif why == bytecode.FILLED_NOW:
            self._bytecode_note = {"installed_bytecode_s": round(time.monotonic() - began, 2)}


@dataclass
class ScriptedStages:
    """Stages written down in advance: ``script[(name, commit or "candidate" or "base")]`` is a list
    of ``Stage`` objects handed out in order (the last one repeats). ``calls`` records each request as
    ``(name, tag, commit)``. For the loop's unit tests; nothing is run."""

    script: dict[tuple[str, str], list[Stage]]
    reference_commit: str | None = None
    defined: set[str] = field(default_factory=set)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    selected: list[tuple[str, ...]] = field(default_factory=list)  # the cases of each run of cases in doubt
    ahead: list[tuple[NextRun, ...]] = field(default_factory=list)  # each request's ``then``, in order
    speculative: list[tuple[NextRun, ...]] = field(default_factory=list)  # each correctness_then_perf's
    on_stage: Callable[[str, str, str], None] | None = None  # called before each stage (a test's side effect)
    no_prestart: str | None = None  # what prestart_refusal says (a test of the unboxed fallback)
    # Set by the command that runs it (``try_change``): each scripted ``duration_s`` goes into the
    # row's timings as a child's would, so budget estimates read scripted sessions like real ones.
    clock: Any = None

    def stage(self, name: str, tag: str, commit: str, cases: dict[str, str | None] | None = None,
              then: Sequence[NextRun] = ()) -> Stage:
        self.calls.append((name, tag, commit))
        self.ahead.append(tuple(then))
        if self.on_stage is not None:
            self.on_stage(name, tag, commit)
        role = "base" if commit == self.reference_commit else "candidate"
        queue = self.script.get((name, commit)) or self.script[(name, role)]
        stage = queue.pop(0) if len(queue) > 1 else queue[0]
        if cases:  # a run of the cases in doubt records those cases only, as a child selected by node id does
            stage = replace(stage, cases=tuple(sorted(cases)),
                            shapes={c: v for c, v in stage.shapes.items() if c in cases})
            self.selected.append(tuple(sorted(cases)))
        if self.clock is not None:
            self.clock.add_child(stage.duration_s, f"{tag}-{name}")
        return stage

    def correctness_then_perf(self, tag: str, commit: str, proceed, perf_tag: str | None = None,
                              then: Sequence[NextRun] = (), speculative: Sequence[NextRun] = ()):
        self.speculative.append(tuple(speculative))
        correctness = self.stage("correctness", tag, commit, then=then)
        if not proceed(correctness):
            return correctness, None
        return correctness, self.stage("perf", perf_tag or tag, commit)

    def prestart_refusal(self) -> str | None:
        return self.no_prestart

    def defined_names(self, commit: str) -> set[str]:
        return set(self.defined)

    def row_fields(self) -> dict:
        return {}

    def __enter__(self) -> ScriptedStages:
        return self

    def __exit__(self, *exc) -> None:
        return None
