"""Which cuTile ops of a TileGym-shaped repository the loop can drive, op by op.

For every kernel file under ``src/**/cutile/`` (``kernel_scan.op_files``) this pairs the test file
the way ``init`` does (``kernel_scan.choose_test_file``, plus a ``test_<op>_perf.py`` written by
``scaffold-perf``), collects the correctness and perf selections of ``init``'s commands, and,
when asked, runs each selection once: pass/fail, wall time and the number of perf records.

Runs go through ``runner`` (own process group, output to a file, killed at the timeout) with
bytecode writing off; nothing in the repository is changed. Library only: nothing here prints.
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from cutile_perf.kernel import kernel_scan
from cutile_perf.child import records, runner, selection
from cutile_perf.store import remove_tree, session as session_mod
from cutile_perf.judge.rules import Thresholds
from cutile_perf.errors import UsageError

WHICH = ("correctness", "perf")


@dataclass(frozen=True)
class RunSummary:
    """One pytest run of a selection (or of its first ``sample`` tests)."""

    ok: bool
    crash: str | None  # runner.CRASH_CLASSES, or "no-record" for a perf run that recorded nothing
    wall_s: float
    tests: int  # node ids passed to pytest (0: the whole selection)
    records: int = 0  # perf only: 'cutile' benchmark records read back
    outcomes: dict[str, int] = field(default_factory=dict)  # pytest's summary: {"passed": 1, "skipped": 2}
    detail: str = ""
    cut: bool = False  # killed because the survey's --budget ran out, not at the op's own --timeout

    def cell(self) -> str:
        if self.cut:
            return f"cut by --budget after {self.wall_s:.0f} s"
        status = "pass" if self.ok else f"FAIL ({self.crash})"
        counts = ", ".join(f"{n} {k}" for k, n in self.outcomes.items())
        extra = f", {self.records} rec" if self.records or not self.ok else ""
        return f"{status} {self.wall_s:.0f} s" + (f" ({counts})" if counts else "") + extra


_OUTCOME = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected)\b")


def parse_outcomes(text: str) -> dict[str, int]:
    """Counts from pytest's last summary line ("1 passed, 2 skipped in 3.1s"); {} when there is none."""
    for line in reversed(text.splitlines()):
        found = _OUTCOME.findall(line)
        if found:
            return {("error" if kind == "errors" else kind): int(n) for n, kind in found}
    return {}


@dataclass
class OpRow:
    kernel: str  # repo-relative kernel file
    test: str | None = None
    perf_test: str | None = None  # set when the perf test lives in its own file
    problem: str = ""  # why the op cannot be driven (no test file, ambiguous, ...)
    not_done: str = ""  # what the survey left out for lack of time (--budget)
    selections: dict[str, selection.Selection] = field(default_factory=dict)
    runs: dict[str, RunSummary] = field(default_factory=dict)

    @property
    def op(self) -> str:
        return Path(self.kernel).stem

    def selected(self, which: str) -> str:
        sel = self.selections.get(which)
        if sel is None:
            return "-"
        return "no CUDA" if sel.needs_cuda else "error" if sel.error else str(sel.count)

    @property
    def needs_cuda(self) -> str:
        """Why this op's tests could not be collected here for want of CUDA; '' otherwise."""
        return next((sel.needs_cuda for sel in self.selections.values() if sel.needs_cuda), "")

    @property
    def drivable(self) -> bool:
        """Paired, both selections non-empty, and (when run) both runs passed."""
        if self.problem or self.not_done or any(w not in self.selections or self.selections[w].error or self.selections[w].empty
                               for w in WHICH):
            return False
        return all(r.ok for r in self.runs.values())

    def to_dict(self) -> dict:
        return {"op": self.op, "kernel": self.kernel, "test": self.test, "perf_test": self.perf_test,
                "problem": self.problem, "not_done": self.not_done, "drivable": self.drivable,
                "needs_cuda": self.needs_cuda,
                "selections": {w: s.to_dict() for w, s in self.selections.items()},
                "runs": {w: vars(r) for w, r in self.runs.items()}}


    def to_data(self) -> dict:
        """Everything in the row, as JSON-able data ``from_data`` rebuilds it from (a worker's
        result crosses a process or a host: ``loop.survey_spread``)."""
        return asdict(self)

    @classmethod
    def from_data(cls, data: dict) -> OpRow:
        sels = {w: selection.Selection(**{**s, "argv": tuple(s["argv"]), "node_ids": tuple(s["node_ids"])})
                for w, s in data["selections"].items()}
        return cls(**{**data, "selections": sels, "runs": {w: RunSummary(**r) for w, r in data["runs"].items()}})


def _session_for(root: Path, kernel_rel: str, test_rel: str, perf_rel: str | None) -> session_mod.Session:
    """The commands ``init`` would write for this op, as a Session (never saved)."""
    perf_cmd = selection.perf_command(perf_rel)
    return session_mod.Session(
        repo=root, kernel=Path(kernel_rel).stem, kernel_files=(kernel_rel,), fence=(kernel_rel,), test=test_rel,
        correctness_cmd=session_mod.CORRECTNESS_TEMPLATE, perf_cmd=perf_cmd, thresholds=Thresholds(),
        timeout_s=600.0,
        base_commit="", branch="", created="")


# A kernel file that tunes itself at launch can spend minutes in its first test: TileGym's bmm runs
# exhaustive_search over 18 sm_90 configs for every new shape, and its first correctness case ran
# past a GPU survey's per-test timeout (docs/survey.md). Said next to such a timeout, so it is not read as a hang.
_SELF_TUNING = re.compile(r"exhaustive_search\s*\(|autotune\w*\s*\(")


def self_tuning_hint(kernel_source: str) -> str:
    """'' or what to do about a run killed at its timeout when the kernel file tunes itself (pure)."""
    if not _SELF_TUNING.search(kernel_source):
        return ""
    return ("the kernel file tunes itself at launch (exhaustive_search/autotune), often per shape: raise "
            "--timeout, or narrow the correctness command to a few shapes before the baseline")


def _kernel_source(session: session_mod.Session) -> str:
    try:
        return (session.repo / session.kernel_files[0]).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def sampled_argv(argv: list[str], test_rel: str, node_ids: tuple[str, ...], sample: int,
                 offset: int = 0) -> tuple[list[str], int]:
    """``argv`` with its test-file argument replaced by ``sample`` selected node ids from ``offset``.

    The ids are re-rooted on ``test_rel`` (pytest prints them relative to its rootdir, which need
    not be the working directory). ``sample`` 0, or a test file not found in argv, keeps ``argv``.
    """
    if sample <= 0 or test_rel not in argv or not node_ids:
        return list(argv), 0
    chosen = [f"{test_rel}::{nid.split('::', 1)[1]}" if "::" in nid else nid
              for nid in node_ids[offset:offset + sample]]
    i = argv.index(test_rel)
    return [*argv[:i], *chosen, *argv[i + 1:]], len(chosen)


# A sampled run whose tests all skipped (a case this GPU does not support) says nothing about the
# op: the next tests are tried, up to this many windows of --sample tests.
SKIPPED_WINDOWS = 3


def all_skipped(run: RunSummary) -> bool:
    return run.crash == "no-tests" and run.outcomes.get("skipped", 0) > 0 and not run.outcomes.get("failed") \
        and not run.outcomes.get("error") and not run.outcomes.get("errors")


def _run_one(session: session_mod.Session, which: str, sel: selection.Selection, test_rel: str, *, timeout_s: float,
             sample: int, log_dir: Path, capped: bool = False, offset: int = 0) -> RunSummary:
    """One run; ``capped``: ``timeout_s`` is what was left of the budget, so a timeout is a cut, not a verdict."""
    argv = [*session.argv(which), *records.NO_CACHE_ARGS]
    argv, tests = sampled_argv(argv, test_rel, sel.node_ids, sample, offset)
    stem = session.kernel_files[0].replace("/", "__").removesuffix(".py")
    out = log_dir / f"{stem}-{which}.log"
    env = {**selection.import_env(session), "PYTHONDONTWRITEBYTECODE": "1"}
    records_file = log_dir / f"{stem}-perf.records.jsonl"
    if which == "perf":
        records_file.unlink(missing_ok=True)
        argv = [*argv, *records.PYTEST_PLUGIN_ARGS]
        env["CUTILE_PERF_RECORDS"] = str(records_file)
    result = runner.run(argv, cwd=session.repo, timeout_s=timeout_s, output_path=out, env_overrides=env)
    crash = runner.classify(result)
    crash = str(crash) if crash is not None else None
    outcomes = parse_outcomes(result.tail())
    count = 0
    detail = ""
    if crash is None and not outcomes.get("passed"):
        # Positive evidence only: a run whose tests all skipped (backend missing, arch excluded) proves nothing.
        crash, detail = "no-tests", "no test passed (all skipped or deselected)"
    if which == "perf" and crash is None:
        try:
            count = sum(1 for r in records.read_records_file(records_file) if r.framework == "cutile")
        except records.RecordError as exc:
            crash, detail = "no-record", str(exc)
        if crash is None and count == 0:
            crash = "no-record"
    if crash and not detail:
        detail = selection.error_summary(result.tail()) if not result.timed_out else f"killed after {timeout_s:g} s"
        if result.timed_out and not capped and (hint := self_tuning_hint(_kernel_source(session))):
            detail += f"; {hint}"
    return RunSummary(crash is None, crash, round(result.duration_s, 1), tests, count, outcomes, detail,
                      cut=capped and result.timed_out)


class NoCuda:
    """Shared by the ops of one survey: set by the first collection that failed for want of CUDA.

    A conftest that needs CUDA to collect (TileGym's asks torch for the GPU's compute capability in
    ``pytest_addoption``) fails every collection the same way, each after a full pytest start-up:
    the ops after the first are not collected at all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason = ""

    def set(self, reason: str) -> None:
        with self._lock:
            self.reason = self.reason or reason


NOT_COLLECTED = "not collected: the tests need CUDA to collect"


class Budget:
    """The survey's total wall-clock budget, shared by every op (None: unlimited)."""

    def __init__(self, seconds: float | None):
        self.end = None if seconds is None else time.monotonic() + seconds

    def cap(self, timeout_s: float) -> float:
        """``timeout_s``, or what is left of the budget when that is less (0: nothing left)."""
        return timeout_s if self.end is None else max(0.0, min(timeout_s, self.end - time.monotonic()))


def survey_op(root: Path, kernel: Path, *, run: bool, timeout_s: float, sample: int, log_dir: Path,
              budget: Budget | None = None, no_cuda: NoCuda | None = None) -> OpRow:
    budget = budget or Budget(None)
    no_cuda = no_cuda or NoCuda()
    row = OpRow(kernel=kernel.relative_to(root).as_posix())
    try:
        test_file, _ = kernel_scan.choose_test_file(root, kernel)
    except UsageError as exc:
        row.problem = exc.message
        return row
    row.test = test_file.relative_to(root).as_posix()
    perf_file = kernel_scan.sibling_perf_test(test_file)
    row.perf_test = perf_file.relative_to(root).as_posix() if perf_file else None
    session = _session_for(root, row.kernel, row.test, row.perf_test)
    for which in WHICH:
        if no_cuda.reason:
            if not row.selections:
                row.not_done = NOT_COLLECTED
            return row
        if not budget.cap(timeout_s):
            row.not_done = "budget spent before collection"
            return row
        cap = budget.cap(timeout_s)
        row.selections[which] = found = selection.collect(which, session.argv(which), cwd=root, timeout_s=cap,
                                                          env=selection.import_env(session))
        if found.needs_cuda:
            no_cuda.set(found.needs_cuda)
            return row
        if cap < timeout_s and found.error.startswith("collection did not finish"):
            row.not_done = "budget spent during collection"
            return row
    if run:
        for which in WHICH:
            sel = row.selections[which]
            if sel.error or sel.empty:
                continue
            if not budget.cap(timeout_s):
                row.not_done = f"budget spent before the {which} run"
                break
            test_rel = row.perf_test if which == "perf" and row.perf_test else row.test
            cap = budget.cap(timeout_s)
            run_ = _run_one(session, which, sel, test_rel, timeout_s=cap, sample=sample, log_dir=log_dir,
                            capped=cap < timeout_s)
            window, spent = 1, run_.wall_s
            while (sample and all_skipped(run_) and window < SKIPPED_WINDOWS
                   and window * sample < len(sel.node_ids) and budget.cap(timeout_s)):
                cap = budget.cap(timeout_s)
                run_ = _run_one(session, which, sel, test_rel, timeout_s=cap, sample=sample, log_dir=log_dir,
                                capped=cap < timeout_s, offset=window * sample)
                spent += run_.wall_s
                window += 1
            if window > 1:
                run_ = replace(run_, wall_s=round(spent, 1),
                               detail=(run_.detail + "; " if run_.detail else "")
                               + f"the first {(window - 1) * sample} sampled test(s) skipped on this machine")
            row.runs[which] = run_
            if row.runs[which].cut:
                row.not_done = f"budget spent during the {which} run"
                break
    return row


def survey(root: Path, *, run: bool = False, timeout_s: float = 300.0, sample: int = 0, jobs: int = 1,
           under: str | None = None, log_dir: Path | None = None, budget_s: float | None = None,
           progress: Callable[[OpRow], None] | None = None, ops: tuple[str, ...] = (),
           spread: Callable[[list[Path]], list[OpRow]] | None = None) -> list[OpRow]:
    """One row per op file, in path order. ``spread``: what surveys the chosen op files instead of
    this process's threads (a worker per GPU, ``loop.survey_spread``); it returns rows in their order. ``under`` keeps kernel files below that repo-relative folder,
    ``ops`` those whose file name (without ``.py``) is one of them.

    ``budget_s`` bounds the whole survey: each child's timeout is capped by what is left, and ops
    reached after it is spent are listed with ``not_done`` instead of being dropped from the table.
    """
    budget = Budget(budget_s)
    no_cuda = NoCuda()
    kernels = kernel_scan.op_files(root)
    if under:
        prefix = under.strip("/") + "/"
        kernels = [k for k in kernels if k.relative_to(root).as_posix().startswith(prefix)]
    if ops:
        unknown = sorted(set(ops) - {k.stem for k in kernels})
        if unknown:
            raise UsageError(f"no cuTile kernel file named {', '.join(unknown)}"
                             + (f" below {under}" if under else ""), "the op is the kernel file name without .py")
        kernels = [k for k in kernels if k.stem in ops]
    if not kernels:
        raise UsageError(f"no cuTile kernel files (defining @ct.kernel) under {root}/src/**/cutile/"
                         + (f" below {under}" if under else ""), "is this a TileGym-shaped repository?")

    if spread is not None:
        rows = spread(kernels)
        for row in rows if progress else ():
            progress(row)
        return rows

    def one(kernel: Path, logs: Path) -> OpRow:
        row = survey_op(root, kernel, run=run, timeout_s=timeout_s, sample=sample, log_dir=logs, budget=budget,
                        no_cuda=no_cuda)
        if progress:
            progress(row)
        return row

    with remove_tree.temporary_folder("cutile-perf-survey-") as tmp:  # removed at any depth
        logs = Path(log_dir) if log_dir else Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(lambda k: one(k, logs), kernels))


# --- rendering -----------------------------------------------------------------------------------


def columns(with_runs: bool) -> list[str]:
    cols = ["op", "kernel", "test", "correctness tests", "perf tests"]
    return cols + (["correctness run", "perf run"] if with_runs else []) + ["drivable"]


def row_cells(row: OpRow, with_runs: bool) -> list[str]:
    test = row.test or "-"
    if row.perf_test:
        test += f" (+ {Path(row.perf_test).name})"
    cells = [row.op, row.kernel, test, row.selected("correctness"), row.selected("perf")]
    if with_runs:
        cells += [row.runs[w].cell() if w in row.runs else "-" for w in WHICH]
    if row.needs_cuda or row.not_done == NOT_COLLECTED:
        cells.append("unknown: no CUDA here to collect")
        return cells
    reason = row.problem or row.not_done or next((f"{w}: {row.selections[w].error[:60]}" for w in WHICH
                                  if w in row.selections and row.selections[w].error), "")
    if not reason and "perf" in row.selections and row.selections["perf"].empty:
        reason = "no perf test (scaffold-perf)"
    cells.append("yes" if row.drivable else f"no: {reason}" if reason else "no")
    return cells


def render_table(rows: list[OpRow], *, with_runs: bool, markdown: bool) -> str:
    cols = columns(with_runs)
    body = [row_cells(r, with_runs) for r in rows]
    if markdown:
        esc = [[c.replace("|", "\\|") for c in cells] for cells in body]
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in esc])
    widths = [max(len(c), *(len(cells[i]) for cells in body)) for i, c in enumerate(cols)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*cols), *(fmt.format(*cells) for cells in body)]).rstrip()


def no_cuda_reason(rows: list[OpRow]) -> str:
    """'' or where and why the survey's collections need CUDA that this machine lacks."""
    return next((r.needs_cuda for r in rows if r.needs_cuda), "")


def summary(rows: list[OpRow]) -> dict[str, int | None]:
    """Counts of the table; the ones only a collection can give are None when none could run here."""
    collected = not no_cuda_reason(rows)
    return {"ops": len(rows), "paired": sum(1 for r in rows if r.test),
            "with_perf_test": sum(1 for r in rows if "perf" in r.selections and r.selections["perf"].count)
            if collected else None,
            "drivable": sum(1 for r in rows if r.drivable) if collected else None}


def no_cuda_line(reason: str, *, after_init: bool = False) -> str:
    """The one line ``survey`` (or, ``after_init``, ``init``) prints when the target's tests need CUDA
    to collect: what failed, and what still works without a GPU."""
    head = f"the tests cannot be collected on this machine, they need CUDA ({reason}); "
    if after_init:
        return head + ("the session is set up and baseline checks the selections on the GPU machine; still works "
                       "here: compile-check, scaffold-perf, status, batch --check")
    return head + ("still works without a GPU: the kernel/test pairing above, init (baseline checks the selections "
                   "on the GPU), compile-check, scaffold-perf; run survey on a GPU machine for selections and runs")
