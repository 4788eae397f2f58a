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
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.child import checkrun, envcheck, groups, measure
from cutile_perf.errors import EXIT_CRASH, EXIT_OK, EXIT_REJECTED, EnvMissing, FenceViolation, IterationCrashed, Locked, NoChange, Refused
from cutile_perf.judge import rules
from cutile_perf.judge.crash import CrashClass
from cutile_perf.kernel import probes
from cutile_perf.judge.verdict import (Evidence, Reference, Stage, Verdict, correctness_status, judge, paired_samples,
                                       stopped)
from cutile_perf.loop import watchdog
from cutile_perf.loop.budget import Budget, BudgetSpent, DoesNotFit, recheck_cost_after, try_estimate
from cutile_perf.loop import offbranch, render
from cutile_perf.loop.stages import Request, Stages, StageRunner
from cutile_perf.output import Outcome, say
from cutile_perf.skill.install import is_installed_skill_path
from cutile_perf.store import atomic, git_ops, safe_read, session as session_mod
from cutile_perf.store.history import History
from cutile_perf.store.session import Session
from cutile_perf.templating import format_change

STEPS = ("started", "committed", "measured", "decided", "recorded", "settled")
STATE_FILE = "iteration.json"
TRAILER = "Cutile-Perf"


# --- small pieces ---------------------------------------------------------------------------------


def slug(text: str, limit: int = 40) -> str:
    """``"occupancy 2 -> 4"`` -> ``"occupancy-2-4"``: a file-name-safe summary."""
    value = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (value[:limit].rstrip("-")) or "change"


def patch_name(number: int, optimization: str) -> str:
    """``"007-occupancy-2-4"``: the iteration zero-padded, so ``ls sandbox/patches`` lists them in order.

    The name is stored in ``iteration.json`` and the saved path in the row, so a state or a row written
    before padding (``7-occupancy-2-4``) keeps its own name: nothing looks a patch up by number."""
    return f"{number:03d}-{slug(optimization)}"


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
        """Wall time, children and harness; ``perf_s``, the perf run(s) of the whole selection, and,
        when the interleaved re-check ran, ``recheck_s`` and ``recheck_runs``: its share of the wall
        time (``total_s / perf_s`` is a try's cost in perf runs)."""
        total = time.monotonic() - self.start
        out = {"total_s": round(total, 4), "children_s": round(self.children_s, 4),
               "harness_s": round(max(total - self.children_s, 0.0), 4), "stages": list(self.stages)}
        recheck = [s for n, s in self.stages if "-confirm" in n]
        perf = [s for n, s in self.stages if n.endswith("-perf") and "-confirm" not in n]
        if perf:
            out["perf_s"] = round(sum(perf), 4)
        if recheck:
            out["recheck_s"], out["recheck_runs"] = round(sum(recheck), 4), len(recheck)
        return out


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


def fenced_content_hash(session: Session, g, commit: str) -> str:
    """sha256 over the fenced files of ``commit`` (each one's path, mode and blob sha, sorted): the
    same content tried again hashes alike, whatever its commit, message or base. Rows carry it as
    ``content_hash``, so a change reverted before is recognised (``reverted_before``)."""
    entries = sorted(f"{e.path}\0{e.mode}\0{e.sha}" for e in git_ops.tree_entries(g, commit)
                     if session.fenced(e.path))
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def reverted_before(rows: list[dict], content_hash: str) -> int | None:
    """The iteration of the last row reverted with this fenced content, or None. Trying a change
    again until one lucky run keeps it (one fast in 30 % of its processes was kept on its 7th
    identical try, issue 39) then needs the whole interleaved re-check (``Evidence.repeat_of``)."""
    for row in reversed(rows):
        if row.get("status") == "revert" and row.get("content_hash") == content_hash:
            return row.get("iteration")
    return None


def commit_message(number: int, optimization: str, reference: str, extra: dict[str, str] | None = None) -> str:
    trailers = {"Iteration": str(number), "Baseline": reference, **(extra or {})}
    return f"cutile-perf {number}: {optimization}\n\n" + "\n".join(f"{TRAILER}-{k}: {v}" for k, v in trailers.items())


def save_patch(session: Session, g, base: str, paths: list[str], name: str) -> str | None:
    """Write the diff ``base`` -> work tree of ``paths`` (untracked files included) to ``sandbox/patches/``.

    Returns the repo-relative patch path, or None when there was nothing to save.
    """
    patch = git_ops.diff_patch(g, base, paths)
    if not patch.strip():
        return None
    target = session.sandbox / "patches" / f"{name}.patch"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(target, patch)
    return str(target.relative_to(session.repo))


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (``/proc/<pid>/stat`` field 22), or None when it is gone.

    A pid and its start time name one process for the life of the machine: a pid reused by an
    unrelated process has another start time.
    """
    fields = groups.stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None


def end_children(children: list) -> list[int]:
    """SIGKILL the recorded process groups that still exist (a kill -9 of ``try`` leaves them running).

    ``children``: ``[pgid, start time]`` pairs. A group is ended only when its leader still has the
    start time recorded when the harness started it: a reused pid is someone else's process.
    """
    ended = []
    for pgid, started in children:
        if started is None or process_start(pgid) != started:
            continue
        if groups.end_group(pgid):
            ended.append(pgid)
    return ended


def state_key(g) -> bytes:
    """The key ``iteration.json`` is signed with, kept in git's own folder beside the log's anchor
    (created on first use, readable by the user only)."""
    path = git_ops.git_common_dir(g) / "cutile-perf" / "state.key"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
        return key


# --- the guards: one check before anything moves --------------------------------------------------


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
    off = offbranch.off_branch(g, kept, head)
    # The kept commit was amended, rebased or reset away: ``resume`` alone cannot choose between the
    # user's commit and the measured one, so the refusal names the flag of each way on.
    raise Refused(off.problem(g, session.branch), off.fix(g))


def require_nothing_pending(session: Session, g) -> None:
    """The guards before the log is opened: the session branch is checked out and no interrupted
    iteration waits for ``resume``."""
    require_session_branch(session, g)
    require_no_interrupted(session)


def require_no_interrupted(session: Session) -> None:
    """Refuse (exit 3) while an interrupted iteration waits for ``resume``: the log's last row may
    be that iteration's own, unanchored, and its commit not settled yet (``try``, ``verify``)."""
    if State.exists(session):
        raise Refused("an interrupted iteration is not settled yet", "run `cutile-perf resume`")


def require_settled(session: Session, g, history: History) -> str:
    """The guards on the history every change runs behind (after ``require_nothing_pending``): a
    baseline exists, the measurement environment is the baseline's, and HEAD is the last kept
    commit. Returns that commit."""
    require_baseline(history)
    kept = history.kept_commit()
    head = git_ops.head(g)
    if head != kept:
        refuse_foreign_commits(session, g, kept, head)
    return kept


def require_baseline(history: History) -> None:
    """Refuse (exit 3) before a baseline is recorded, or under another measurement environment than
    the baseline's (``require_baseline_env``): what ``try`` and ``verify`` measure against."""
    if history.baseline() is None:
        raise Refused("no baseline recorded yet", "run `cutile-perf baseline` first")
    require_baseline_env(history)


def require_baseline_env(history: History) -> None:
    """Refuse (exit 3) to measure under other timing, autotune, compiler or import switches than the
    baseline ran under (``knobs.MEASUREMENT_ENV_NAMES``): the records would move with no change to
    the kernel."""
    changed = history.env_changes(knobs.measurement_env())
    if changed:
        raise Refused("the environment that shapes measurements differs from the baseline's: " + "; ".join(changed),
                      "set it as it was at the baseline (the log's first row, frozen_env), or start a new session")


def isolation(stages) -> str:
    """The row's ``sandbox`` field: "unshare" when every child ran in a box (``child.box``), else the
    first stage's "none: <why>" (never a silent fallback: status, report and verify show it)."""
    labels = [s.sandbox for s in stages if s is not None and s.sandbox]
    unboxed = [label for label in labels if label != "unshare"]
    return unboxed[0] if unboxed else ("unshare" if labels else "none: no child ran")


def fenced_changes(session: Session, changed: list[str]) -> list[str]:
    """The changed paths an iteration owns: inside the fence, sandbox excluded."""
    return [p for p in changed if session.fenced(p)]


def paths_touched(session: Session, g, base: str) -> list[str]:
    """Fenced paths that differ from ``base`` in HEAD or in the work tree."""
    committed = git_ops.changed_between(g, base, "HEAD") if git_ops.head(g) != base else []
    return sorted({*fenced_changes(session, committed), *fenced_changes(session, git_ops.changed_paths(g))})


def _outside_fence_ignorable(path: str) -> bool:
    """Untracked files no stage can ever see: bytecode caches never enter a pristine checkout."""
    return "__pycache__/" in path or path.endswith((".pyc", ".pyo"))


def refuse_probes(g, base: str, paths: list[str]) -> None:
    """Refuse (exit 3, nothing touched) a change that adds measurement-context probes or patches the
    clocks and statistics that time it (``kernel.probes``): perf-only behaviour is stopped before it
    runs, and the change stays in the work tree for the user to see."""
    old, new = {}, {}
    root = git_ops.root(g)
    for rel in paths:
        if not rel.endswith(".py"):
            continue
        target = root / rel
        if not target.is_file():
            continue
        why = probes.too_large(rel, target.stat().st_size)
        if why:
            raise Refused(why, "split it into smaller modules (the change is untouched)")
        new[rel] = safe_read.read_text(target, probes.MAX_SOURCE_BYTES)
        sha = git_ops.blob_sha_at(g, base, rel)
        previous = git_ops.blob_bytes(g, sha) if sha else None
        # The base's copy, scanned only within the same bound (a bigger one was never scanned either).
        old[rel] = previous.decode("utf-8", errors="replace") \
            if previous is not None and len(previous) <= probes.MAX_SOURCE_BYTES else None
    findings = probes.scan(old, new)
    if findings:
        raise Refused(probes.describe(findings), "a kernel that asks whether it is being measured, or patches what "
                      "measures it, is never tried; remove those lines (the change is untouched)")


def candidate_paths(session: Session, g) -> list[str]:
    """The fenced paths this iteration changes, or the refusal that says why it cannot run."""
    changed = [p for p in git_ops.changed_paths(g) if not _outside_fence_ignorable(p)
               and not is_installed_skill_path(p)]
    outside = [p for p in changed if not session.in_fence(p)]
    if outside:
        shown = ", ".join(outside[:5]) + (" ..." if len(outside) > 5 else "")
        raise FenceViolation(f"changes outside the fence: {shown}; fence: {', '.join(session.fence)}",
                             "undo them yourself (cutile-perf never touches them), or fence them at init with --allow")
    paths = fenced_changes(session, changed)
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


# --- the persisted state --------------------------------------------------------------------------


_CHILDREN_LOCK = threading.Lock()


def _sign(key: bytes, data: dict) -> str:
    return hmac.new(key, json.dumps(data, sort_keys=True).encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass
class State:
    """How far one iteration got, persisted in ``file`` after every step, signed with ``key``.

    ``resume`` acts on this file (it appends the row it holds and ends the process groups it
    names), so a file cutile-perf did not write is refused: the signature is an HMAC under a key
    kept in git's folder (``state_key``).
    """

    file: Path
    key: bytes
    iteration: int
    optimization: str
    name: str  # patch_name(): "<iteration, 3 digits>-<slug>", the saved patch's name
    base: str  # the kept commit the branch returns to on anything but a keep
    reference: str  # the baseline commit the candidate is judged against
    paths: list[str]  # the fenced paths this iteration changes
    step: str = "started"
    patch: str | None = None
    candidate: str | None = None
    row: dict | None = None
    row_hash: str | None = None
    children: list = field(default_factory=list)  # [pgid, start time] of each pytest child's group
    plan_entry: str | None = None  # the batch plan entry this change is (``plan.digest``), carried into its row

    @staticmethod
    def path(session: Session) -> Path:
        return session.sandbox / STATE_FILE

    @classmethod
    def exists(cls, session: Session) -> bool:
        return cls.path(session).exists()

    @classmethod
    def load(cls, session: Session, key: bytes) -> State | None:
        file = cls.path(session)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise OSError(f"{file} is unreadable ({exc}); it records an interrupted iteration") from None
        signature = data.pop("signature", None) if isinstance(data, dict) else None
        if not isinstance(signature, str) or not hmac.compare_digest(signature, _sign(key, data)):
            raise Refused(f"{file.relative_to(session.repo)} is not the state cutile-perf wrote (its signature does "
                          "not match)", "nothing was done; if no iteration was interrupted, delete the file, then "
                          "run `cutile-perf resume` (the log and git say what was recorded)")
        known = {f.name for f in fields(cls)} - {"file", "key"}
        return cls(file=file, key=key, **{k: v for k, v in data.items() if k in known})

    def save(self) -> None:
        data = json.loads(json.dumps({k: v for k, v in asdict(self).items() if k not in ("file", "key")}, default=str))
        data["signature"] = _sign(self.key, data)
        atomic.write_text(self.file, json.dumps(data, indent=1) + "\n")

    def advance(self, step: str, **changes) -> None:
        """Record that ``step`` is done (with its data), durably, then honour the test kill hook."""
        if STEPS.index(step) < STEPS.index(self.step):
            raise ValueError(f"iteration state cannot go back from {self.step} to {step}")
        for key, value in changes.items():
            setattr(self, key, value)
        self.step = step
        self.save()
        knobs.kill_point(step)

    def add_child(self, pgid: int) -> None:
        # Children start from several threads (sharded correctness, a pre-started perf child): one
        # append-and-save at a time, or a later save could write a list without an earlier pgid.
        with _CHILDREN_LOCK:
            self.children.append([pgid, process_start(pgid)])
            self.save()

    def clear(self) -> None:
        self.file.unlink(missing_ok=True)


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
        base = require_settled(session, g, history)
        paths = candidate_paths(session, g)
        refuse_probes(g, base, paths)
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
                            repeat_of=reverted_before(self.history.rows, self.content_hash()))
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
        for rel in self.state.paths:
            if git_ops.worktree_blob_sha(self.g, rel) != git_ops.blob_sha_at(self.g, self.state.candidate, rel):
                return True
        return False

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
        row = self.row(verdict, evidence, fields_of_runner)
        if verdict.action == "keep":  # HEAD is the candidate on the session branch (moved_since said so)
            row["commit"] = git_ops.amend_message(self.g, self.trailers_message(verdict))
        state.advance("decided", row=row)
        return self.finish()

    def row(self, verdict: Verdict, evidence: Evidence, runner_fields: dict) -> dict:
        status, perf = verdict.action, evidence.perf
        fields_ = dict(crash_class=verdict.crash_class.value if verdict.crash_class else None,
                       patch=self.state.patch if status != "keep" else None, reason=verdict.reason,
                       review=verdict.review, reference_commit=self.ref.commit, content_hash=self.content_hash(),
                       **self._origin())
        paired = paired_samples(evidence.pairs, sorted(self.ref.medians))
        if any(base for base, _ in paired.values()):
            # Only the cases the re-check measured (all of them, or the cases in doubt).
            fields_["confirm"] = {case: {"base": base, "candidate": cand} for case, (base, cand) in paired.items()
                                  if base}
        if verdict.decision is not None:
            fields_["decision"] = asdict(verdict.decision)
        fields_.update(runner_fields)
        fields_["sandbox"] = isolation(evidence.stages())
        fields_.update(checkrun.row_fields([perf, *(run for pair in evidence.pairs for run in pair)]))
        if perf is not None and perf.shapes:
            fields_["shapes"] = shapes_field(perf.shapes, perf.test_ids)
            if status != "crash" and set(self.ref.medians) <= set(perf.shapes):
                fields_["latency_ms"] = rules.combine_latency({c: perf.shapes[c] for c in self.ref.medians})
        return base_entry(self.session, iteration=self.state.iteration, optimization=self.state.optimization,
                          status=status, correctness=correctness_status(verdict, perf_ran=perf is not None),
                          commit=self.state.candidate, base_commit=self.state.base, clock=self.clock, probe=self.probe,
                          **fields_)

    def _origin(self) -> dict:
        """Row fields naming where the change came from: the batch plan entry, when it is one."""
        return {"plan_entry": self.state.plan_entry} if self.state.plan_entry else {}

    def trailers_message(self, verdict: Verdict) -> str:
        d = verdict.decision
        extra = {"Verdict": f"keep ({d.tier})" if d else "keep"}
        if d is not None and d.geomean_change is not None:
            extra["Geomean"] = format_change(d.geomean_change)
        if d is not None and d.worst_shape:
            gate = d.gates.get(d.worst_shape)
            change = d.changes.get(d.worst_shape)
            extra["Worst-Case"] = (f"{d.worst_shape} {format_change(change) if change is not None else '?'}"
                                   + (f" (gate {gate * 100:.1f} %)" if gate is not None else ""))
        extra["Log-Prev"] = self.history.head_hash()
        if verdict.review:
            extra["Review"] = "claimed speedup beyond the plausibility factor; re-measured interleaved"
        return commit_message(self.state.iteration, self.state.optimization, self.ref.commit, extra)

    def finish(self, unfinished: Verdict | None = None) -> dict:
        """Complete the transaction from whatever step it reached; returns its row.

        Before ``decided`` there is no verdict: the row is a crash of ``unfinished``'s class. From
        ``decided`` on the prepared row is recorded (once) and the branch settled by it.
        """
        state = self.state
        if STEPS.index(state.step) < STEPS.index("decided"):
            verdict = unfinished or stopped(None, "stopped before a verdict")
            row = base_entry(self.session, iteration=state.iteration, optimization=state.optimization,
                             status="crash", correctness=correctness_status(verdict, perf_ran=False,
                                                                            seen=self.correctness_seen),
                             commit=state.candidate, base_commit=state.base,
                             clock=self.clock, probe=self.probe, crash_class=verdict.crash_class.value,
                             patch=state.patch, reason=verdict.reason[:300], **self._origin())
            state.advance("decided", row=row)
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
    require_gpu(session, probe)
    with session_mod.locked(session.repo, "try", optimization=optimization):
        g = git_ops.open_repo(session.repo)
        require_nothing_pending(session, g)
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
    require_session_branch(session, g)
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
            refuse_foreign_commits(session, g, kept, head)
        if off is not None:
            actions.append(settle_off_branch(session, g, history, off))
            kept = history.kept_commit()
        return ResumeResult(actions, kept, paths_touched(session, g, kept), settled_off_branch=off is not None)


def try_outcome(row: dict, stop: str | None) -> Outcome:
    """A ``try`` row as a command reports it: one line, its data, the exit code of its decision."""
    status = row["status"]
    code = {"keep": EXIT_OK, "revert": EXIT_REJECTED}.get(status, EXIT_CRASH)
    data = {"iteration": row["iteration"], "decision": status, "reason": row.get("reason", ""),
            "patch": row.get("patch"), "latency_ms": row.get("latency_ms"), "commit": row.get("commit"),
            "crash_class": row.get("crash_class"), "review": row.get("review", False), "stop": stop}
    text = decision_line(data)
    if stop:
        text += f"; stop: {stop}"
    return Outcome(text, data, code)


def decision_line(data: dict) -> str:
    """``iteration N: <decision> - <reason> (patch: ...)`` from a ``try`` result's data (stop rule not included)."""
    text = f"iteration {data['iteration']}: {data['decision']} - {data.get('reason', '')}"
    if data.get("patch"):
        text += f" (patch: {data['patch']})"
    return text
