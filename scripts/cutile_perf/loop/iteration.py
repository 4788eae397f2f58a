"""Pieces shared by ``baseline``, ``try`` and ``resume``: log entries, patches, reverts, timings.

The order of the destructive steps is the safety rule: the candidate's patch is written to disk and
its path logged *before* the work tree is reset, so a kill at any point leaves the work recoverable.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cutile_perf.store import atomic, git_ops, log
from cutile_perf.child import envcheck
from cutile_perf.loop import render
from cutile_perf.output import say
from cutile_perf.errors import EnvMissing, Refused
from cutile_perf.store.session import Session


def slug(text: str, limit: int = 40) -> str:
    """``"occupancy 2 -> 4"`` -> ``"occupancy-2-4"``: a file-name-safe summary."""
    value = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (value[:limit].rstrip("-")) or "change"


@dataclass
class Clock:
    """Wall time of the command and time spent inside pytest children, for the overhead figure."""

    start: float = field(default_factory=time.monotonic)
    children_s: float = 0.0
    # (stage, seconds) of each pytest child in order: where an iteration's time went
    # (benchmarks/harness_overhead.py --tilegym reads it).
    stages: list = field(default_factory=list)

    def add_child(self, seconds: float, stage: str = "child") -> None:
        self.children_s += seconds
        self.stages.append([stage, round(seconds, 3)])

    def timings(self) -> dict:
        total = time.monotonic() - self.start
        return {"total_s": round(total, 4), "children_s": round(self.children_s, 4),
                "harness_s": round(max(total - self.children_s, 0.0), 4), "stages": list(self.stages)}


def require_gpu(session: Session, probe: envcheck.Probe) -> None:
    """Refuse (EnvMissing, exit 3) before anything is touched when no usable GPU is found.

    Without a GPU the perf tests skip and every iteration would end as a ``no-record`` crash row.
    ``require_gpu: false`` in session.yaml turns the gate off (the CPU test suite's simulated repo).
    """
    if not session.require_gpu:
        return
    env = probe.result()
    if env.gpu is None:
        # nvidia-smi found nothing; torch may still see a GPU (a container without nvidia-smi).
        # Slow (imports torch), so only on this rare path.
        env = envcheck.check(with_torch=True)
    if env.gpu_problems:
        raise EnvMissing("no usable GPU: " + "; ".join(p.message for p in env.gpu_problems),
                         "nothing was changed; `cutile-perf env` shows what this machine has")


def require_session_branch(session: Session, g) -> None:
    """Refuse (exit 3) unless the session branch is checked out.

    Right after ``init`` the user's branch and the session branch are the same commit, so the HEAD
    check alone would let ``try`` commit onto ``main`` (or onto a detached HEAD, where the commit is
    lost at the next checkout), and ``resume`` reset ``main``'s own commits away.
    """
    branch = git_ops.current_branch(g)
    if branch != session.branch:
        where = "a detached HEAD" if branch is None else f"branch {branch}"
        raise Refused(f"the repository is on {where}, not the session branch {session.branch}",
                      f"git checkout {session.branch}, then run the command again")


def fenced_changes(session: Session, changed: list[str]) -> list[str]:
    """The changed paths an iteration owns: inside the fence, sandbox excluded."""
    return [p for p in changed if session.in_fence(p) and not p.startswith("sandbox/")]


def paths_touched(session: Session, g, base: str) -> list[str]:
    """Fenced paths that differ from ``base`` in HEAD or in the work tree."""
    committed = git_ops.changed_between(g, base, "HEAD") if git_ops.head(g) != base else []
    return sorted({*fenced_changes(session, committed), *fenced_changes(session, git_ops.changed_paths(g))})


def base_entry(session: Session, *, iteration: int, optimization: str, status: str, correctness: str,
               commit: str | None, base_commit: str | None, clock: Clock, probe: envcheck.Probe | None = None,
               **extra) -> dict:
    """One log record with the provenance every entry carries; ``probe``: the command's environment check."""
    entry = {
        "iteration": iteration,
        "optimization": optimization,
        "status": status,
        "correctness": correctness,
        "commit": commit,
        "base_commit": base_commit,
        "kernel": session.kernel,
        "branch": session.branch,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "env": probe.result().record() if probe is not None else envcheck.snapshot(),
    }
    entry.update(extra)
    entry["timings"] = clock.timings()
    return entry


def record(session: Session, g, entry: dict) -> str:
    """Append ``entry`` to the chained log, then re-render perf_results.md (a failed render only warns:
    the log is the truth and ``status``/``report`` render it again). Returns the row's hash."""
    from cutile_perf.loop import txn# noqa: PLC0415 - txn imports iteration's neighbours, not iteration

    digest = txn.append_row(session, g, entry)
    render_results(session)
    return digest


def render_results(session: Session) -> None:
    try:
        atomic.write_text(session.results_path, render.render_perf_results(log.read_entries(session.log_path)))
    except OSError as exc:
        say(f"warning: could not write {session.results_path.name} ({exc}); the log is intact")


def shapes_field(medians: dict[str, float], test_ids: dict[str, str],
                 runs: dict[str, list[float]] | None = None) -> dict[str, dict]:
    """The log's per-shape record: median ms, the pytest node id and, when repeated, each run's median.

    A non-finite median (a ``bad-record`` crash) is kept as its text ("nan", "inf"): the log is
    strict JSON, and the row must still show what the run claimed.
    """
    out = {}
    for sid, median in medians.items():
        shown = median if isinstance(median, (int, float)) and math.isfinite(median) else str(median)
        out[sid] = {"median": shown, "test_id": test_ids.get(sid)}
        if runs and sid in runs:
            out[sid]["runs"] = runs[sid]
    return out


# --- the loop's state, checked once per command -------------------------------------------------


def open_history(session: Session, g, *, for_change: bool = True):
    """The session's history, refused (exit 3) when the log was altered or session.yaml was edited
    after the baseline froze it. ``for_change=False`` (status) skips the refusals."""
    from cutile_perf.loop import txn# noqa: PLC0415
    from cutile_perf.loop.history import History  # noqa: PLC0415

    broken = txn.check_log(session, g)
    if broken and for_change:
        raise Refused(f"{session.log_path.relative_to(session.repo)} is not the log cutile-perf wrote: {broken}",
                      "restore it from a backup or start a new session; `cutile-perf status` shows the rows")
    history = History.read(session.log_path)
    frozen = history.frozen()
    if frozen is not None and for_change:
        now = session.frozen()
        edited = sorted(k for k in set(frozen) | set(now) if frozen.get(k) != now.get(k))
        if edited:
            raise Refused(f"sandbox/session.yaml changed after the baseline froze it ({', '.join(edited)})",
                          "put the file back as it was (the log's first row holds the frozen values) or start "
                          "a new session with init")
    return history


def settle_interrupted(session: Session, g, state, *, crash_class: str, reason: str, clock: Clock,
                       probe: envcheck.Probe | None = None) -> dict:
    """Finish ``state`` the one consistent way from whatever step it reached (see ``txn``); returns its row.

    Before ``decided`` there is no verdict: the row is a crash of ``crash_class``. From ``decided``
    on the prepared row is appended (once: a row already in the log is recognised by its hash) and
    the branch settled by it.
    """
    from cutile_perf.loop import txn# noqa: PLC0415

    if txn.STEPS.index(state.step) < txn.STEPS.index("decided"):
        row = base_entry(session, iteration=state.iteration, optimization=state.optimization, status="crash",
                         correctness="FAIL", commit=state.candidate, base_commit=state.base, clock=clock, probe=probe,
                         crash_class=crash_class, patch=state.patch, reason=reason[:300])
        state.advance(session, "decided", row=row)
    if state.step == "decided":
        entries = log.read_entries(session.log_path)
        last = entries[-1] if entries else {}
        already = {k: v for k, v in last.items() if k != "prev"} == json_roundtrip(state.row)
        digest = log.head_hash(session.log_path) if already else record(session, g, state.row)
        state.advance(session, "recorded", row_hash=digest)
    if state.step == "recorded":
        if state.row.get("status") != "keep":
            txn.revert_to_base(session, g, state)
        state.advance(session, "settled")
    state.clear(session)
    return state.row


def json_roundtrip(entry: dict) -> dict:
    import json  # noqa: PLC0415

    return json.loads(log.entry_line(entry))


def refuse_foreign_commits(session: Session, g, kept: str, head: str) -> None:
    """HEAD is not the last kept commit: refuse, naming what is there, never drop or adopt it silently.

    Commits made by hand on the session branch were never measured by the loop; turning them back
    into an uncommitted change lets ``try`` measure them like any other change.
    """
    if git_ops.is_ancestor(g, kept, head):
        shas = git_ops.commits_between(g, kept, head)
        shown = ", ".join(git_ops.short(g, s) for s in shas[:5])
        raise Refused(f"{len(shas)} commit(s) on {session.branch} after the last kept commit {git_ops.short(g, kept)} "
                      f"were not made by cutile-perf ({shown})",
                      f"to have them measured: git reset --soft {git_ops.short(g, kept)}, then cutile-perf try; "
                      "to keep them aside: git branch <name> HEAD first")
    raise Refused(f"HEAD {git_ops.short(g, head)} is not the last kept commit {git_ops.short(g, kept)}",
                  "run `cutile-perf resume`")


class StageRunner:
    """Runs test stages in pristine checkouts of commits (one checkout per commit, built once).

    Protected paths always come from the session's base commit, fenced paths from the commit asked
    for: the baseline, every candidate, the interleaved re-check and ``verify`` all measure this way.
    """

    def __init__(self, session: Session, g, deadline, clock: Clock, on_start=None, fresh_compile_cache: bool = False):
        """``fresh_compile_cache``: compile everything in an empty cache of this runner's own
        (``verify``) instead of the session's guarded one; only with ``jit_cache`` on."""
        from cutile_perf.child import measure# noqa: PLC0415 - measure imports session, not iteration

        self.measure = measure
        self.session, self.g, self.deadline, self.clock, self.on_start = session, g, deadline, clock, on_start
        self.tracked = git_ops.tracked_files(g)
        self.checkouts: dict = {}
        self.fenced: dict[str, list[str]] = {}
        self.fresh_compile_cache = fresh_compile_cache
        self.compile_cache: Path | None = None  # set on entry when the session keeps a JIT cache
        self.dropped_compiled: list[str] = []  # cache entries no earlier command recorded, dropped on entry
        self._exits = contextlib.ExitStack()

    def fenced_files(self, commit: str) -> list[str]:
        # Asked for by every stage of a commit: list its tree once.
        if commit not in self.fenced:
            self.fenced[commit] = [e.path for e in git_ops.tree_entries(self.g, commit) if self.session.in_fence(e.path)]
        return self.fenced[commit]

    def checkout(self, commit: str):
        from cutile_perf.child import pristine# noqa: PLC0415

        if commit not in self.checkouts:
            # With the JIT cache, the n-th checkout of every command has the same path (the cache
            # keys embed it); without it, a fresh random one as always.
            slot = pristine.slot_root(self.session.repo, len(self.checkouts)) if self.compile_cache else None
            built = pristine.build(self.g, protected_from=self.session.base_commit, fenced_from=commit,
                                   fence=self.session.fence, root=slot)
            self.checkouts[commit] = replace(built, compile_cache=self.compile_cache)
        return self.checkouts[commit]

    def stage(self, name: str, tag: str, commit: str, session: Session | None = None):
        """``session``: another command set for this one stage (``verify --full-tests``); the
        checkouts, fence and protected files stay the runner's."""
        result = self.measure.run_stage(session or self.session, name, tag, self.deadline, checkout=self.checkout(commit),
                                        fenced_files=self.fenced_files(commit), tracked=self.tracked,
                                        on_start=self.on_start)
        self.clock.add_child(result.duration_s, f"{tag}-{name}")
        return result

    def correctness_then_perf(self, tag: str, commit: str, proceed: Callable[[Any], bool]):
        """Correctness, then perf, of ``commit``, with the perf child started at once and held
        before its first test (``runner.Gate``): its start-up (interpreter, torch, imports,
        collection) overlaps the correctness run. ``proceed(correctness_stage)`` says whether to
        let it run; if not, it is killed. Returns ``(correctness, perf or None)``.

        Only start-up overlaps: no perf test starts before the correctness child has ended. Each
        stage still snapshots the protected files before its child starts and compares them after
        it ends, so the two windows together cover everything from the first start to the last end.
        """
        from cutile_perf.child import runner# noqa: PLC0415

        gate = runner.Gate()
        perf_groups: list[int] = []

        def perf_started(pgid: int) -> None:
            perf_groups.append(pgid)
            if self.on_start is not None:
                self.on_start(pgid)

        checkout, fenced = self.checkout(commit), self.fenced_files(commit)
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(self.measure.run_stage, self.session, "perf", tag, self.deadline, checkout=checkout,
                                  fenced_files=fenced, tracked=self.tracked, on_start=perf_started, gate=gate)
            try:
                correctness = self.stage("correctness", tag, commit)
                go = proceed(correctness)
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
        self.clock.add_child(perf.duration_s, f"{tag}-perf")
        return correctness, perf

    def row_fields(self) -> dict:
        """What a baseline or try row says of this runner: the unrecorded compiled kernels it dropped,
        when there were any (on the record a reviewer reads, not only on stderr)."""
        return {"compile_cache_dropped": len(self.dropped_compiled)} if self.dropped_compiled else {}

    def defined_names(self, commit: str) -> set[str]:
        return self.measure.defined_names(self.checkout(commit).root, self.fenced_files(commit))

    def close(self) -> None:
        try:
            for checkout in self.checkouts.values():
                checkout.remove()
            self.checkouts.clear()
        finally:
            self._exits.close()  # records the session cache: every child of this command has ended

    def __enter__(self) -> StageRunner:
        from cutile_perf.store import jitcache# noqa: PLC0415

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
