"""What runs an iteration's test stages: one protocol and the real runner (a scripted one for tests).

``Iteration`` asks a ``Stages`` object to ``run`` each request (correctness, perf, the interleaved
re-check's runs), judges what came back, and may say which runs follow (``expect``); it never
learns how they ran. ``StageRunner`` runs pytest children in pristine checkouts built from the
commits (``child.pristine``, ``child.measure``) through the child pool (``child.pool``: the runs
expected start as spare children, parked before any code of the repository). The tests'
``ScriptedStages`` (``tests/scripted_stages.py``) returns stages a test wrote down in advance, so
the loop's unit tests run in milliseconds without a child process (the way Kernel Tuner's
simulation runner stands in for a GPU).
"""
from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from cutile_perf.child import bytecode, checkrun, measure, pristine, warmstart
from cutile_perf.child.pool import Pool, Request
from cutile_perf.judge.verdict import Stage
from cutile_perf.output import say
from cutile_perf.store import git_ops, jitcache
from cutile_perf.store.history import History
from cutile_perf.store.session import Session

__all__ = ["Request", "StageRunner", "Stages"]

SPARE_READY_S = 60.0  # how long a timed run's first test waits for the spares started beside it to park


class Stages(Protocol):
    """Runs one iteration's stages; a context manager around all of them."""

    clock: Any  # the command's ``row.Clock``: each stage's duration goes into the row's timings

    def run(self, request: Request) -> Stage: ...

    def expect(self, requests: Sequence[Request]) -> None: ...

    def defined_names(self, commit: str) -> set[str]: ...

    def row_fields(self) -> dict: ...

    def __enter__(self) -> Stages: ...

    def __exit__(self, *exc) -> None: ...


class StageRunner:
    """Runs test stages in pristine checkouts of commits (one checkout per commit, built once).

    Protected paths always come from the session's base commit, fenced paths from the commit asked
    for: the baseline, every candidate, the interleaved re-check and ``verify`` all measure this way.
    Each run is a fresh child; the runs ``expect``ed start as spares (``child.pool``).
    """

    def __init__(self, session: Session, g, deadline, clock, on_start=None, fresh_compile_cache: bool = False,
                 preload: Sequence[str] = (), slot_base: int = 0):
        """``fresh_compile_cache``: compile everything in an empty cache of this runner's own
        (``verify``, a worker of ``screen --gpus``) instead of the session's guarded one; only with
        ``jit_cache`` on. ``preload``: the installed modules every spare imports while it waits (the
        baseline row's ``preload``, ``History.preload``). ``slot_base``: where this runner's stable
        checkout paths start (runners of one session at once each need their own)."""
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
        self._slots = itertools.count(slot_base)
        self._said_no_spare = False
        self.pool = Pool(self._launch, self._may_park, lambda: min(SPARE_READY_S, max(self.deadline.left(), 0.0)),
                         on_start)

    def fenced_files(self, commit: str) -> list[str]:
        # Asked for by every stage of a commit: list its tree once.
        if commit not in self.fenced:
            self.fenced[commit] = [e.path for e in git_ops.tree_entries(self.g, commit) if self.session.fenced(e.path)]
        return self.fenced[commit]

    def checkout(self, commit: str):
        """The checkout of ``commit``, built once. A spare runs in it too, even while its commit's
        previous run is still there: it reads nothing of it until let go, and the checkout is swept
        for it then (``measure.run_stage``)."""
        if commit not in self.checkouts:
            # With the JIT cache, the n-th checkout of every command has the same path (the cache
            # keys embed it); without it, a fresh random one as always.
            slot = pristine.slot_root(self.session.repo, next(self._slots)) if self.compile_cache else None
            built = pristine.build(self.g, protected_from=self.session.base_commit, fenced_from=commit,
                                   fence=self.session.fence, root=slot)
            self.checkouts[commit] = replace(built, compile_cache=self.compile_cache,
                                             installed_bytecode=self.installed_bytecode)
        return self.checkouts[commit]

    def spare_refusal(self) -> str | None:
        """Why no run starts as a spare here, or None. Only in the box: the running child must not
        find the waiting one's checkout, nor its process (the box has its own file view and process
        namespace); only where the session allows it (``prestart_perf``), and only for a
        ``python -m pytest`` command (``child.warmstart``)."""
        if not self.session.prestart_perf:
            return "session.yaml has prestart_perf: false"
        if warmstart.warm_argv(self.session.argv("perf")) is None:
            return "the perf command is not '{python} -m pytest ...'"
        why = measure.box_why_not(self.session)
        return f"its children run without the sandbox ({why})" if why else None

    def _may_park(self, request: Request) -> bool:
        if request.name != "perf":
            return False
        why = self.spare_refusal()
        if why and not self._said_no_spare:
            self._said_no_spare = True
            say(f"no spare perf child: {why}")
        return why is None

    def expect(self, requests: Sequence[Request]) -> None:
        self.pool.expect(requests)

    def run(self, request: Request) -> Stage:
        """Run ``request`` through the pool: a fresh child, or the spare parked for it. No other
        child does anything while a perf run times (``child.pool``)."""
        if request.name == "perf":
            self._finish_filling()  # no process of ours compiles beside a timed run
        result = self.pool.run(request)
        self.clock.add_child(result.duration_s, f"{request.tag}-{request.name}")
        if request.name == "perf":
            if request.check:
                result = self.check_timed_calls(result, request.commit, request.tag)
            checkrun.discard_captures(self.session, result)
        return replace(result, cases=tuple(sorted(request.cases))) if request.cases else result

    def stage(self, name: str, tag: str, commit: str, cases: dict[str, str | None] | None = None,
              session: Session | None = None) -> Stage:
        """One run, for the commands that ask for single stages (``adopt``, ``verify``). ``session``:
        another command set for this one stage (``verify --full-tests``); the checkouts, fence and
        protected files stay the runner's, and no spare runs it."""
        if session is None:
            return self.run(Request(name, tag, commit, cases))
        result = measure.run_stage(session, name, tag, self.deadline, checkout=self.checkout(commit),
                                   fenced_files=self.fenced_files(commit), tracked=self.tracked,
                                   on_start=self.on_start, select=Request(name, tag, commit, cases).select)
        self.clock.add_child(result.duration_s, f"{tag}-{name}")
        return replace(result, cases=tuple(sorted(cases))) if cases else result

    def _launch(self, request: Request):
        """What runs ``request``'s child (``child.pool.Launch``); its checkout is built here, in the
        caller's thread."""
        checkout, fenced = self.checkout(request.commit), self.fenced_files(request.commit)

        def job(gate, start, on_start) -> Stage:
            return measure.run_stage(self.session, request.name, request.tag, self.deadline, checkout=checkout,
                                     fenced_files=fenced, tracked=self.tracked, on_start=on_start, gate=gate,
                                     select=request.select, start=start,
                                     preload=self.preload if start is not None else ())
        return job

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

    def row_fields(self) -> dict:
        """What a baseline or try row says of this runner, on the record a reviewer reads and not only
        on stderr: the unrecorded compiled kernels it dropped, and the installed-code bytecode."""
        fields: dict = {"compile_cache_dropped": len(self.dropped_compiled)} if self.dropped_compiled else {}
        return {**fields, **self._bytecode_note}

    def defined_names(self, commit: str) -> set[str]:
        return measure.defined_names(self.checkout(commit).root, self.fenced_files(commit))

    def close(self) -> None:
        try:
            self._finish_filling()
            self.pool.close()  # an interrupt can leave a child running: none outlives the runner
            for checkout in self.checkouts.values():
                checkout.remove()
            self.checkouts.clear()
        finally:
            self._exits.close()  # records the session cache: every child of this command has ended

    def __enter__(self) -> StageRunner:
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
        timed (``run``)."""
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
