"""One test stage: run the correctness or perf command in a pristine checkout and gather its evidence.

A stage never raises for a failing kernel. It returns a ``Stage`` whose ``crash`` names the class
(``crash.CrashClass``) when the child failed or when an integrity check caught something:

* the signed run report (``runreport``) says which tests passed and whether the session ended;
* protected files (tests, conftests, config, session.yaml, the log) are snapshotted before the
  child and compared after it, in the user's repository and in the checkout (``tampered``);
* every module whose name a fenced file defines must have been imported from the checkout
  (``measured-wrong-code``);
* each perf case must have exactly one record (``bad-record`` otherwise).

Output files live in ``sandbox/runs/`` so a failure can be read later.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.store import jitcache
from cutile_perf.child import box, pristine, protected, records, runner, runreport, warmstart
from cutile_perf.judge import rules
from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.verdict import Stage
from cutile_perf.store.session import Session
from cutile_perf.store import remove_tree, safe_read

FRAMEWORK = "cutile"
FORWARD = "forward"
# Files outside the fence whose change during a child run is tampering (besides every test file).
CHECK_FOLDER = "checked"  # where a perf child saves its checked timed calls (child.checked), in its private folder


class Deadline:
    """The iteration's time budget, shared by all of its pytest children."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.budget = seconds

    def left(self) -> float:
        return max(self.end - time.monotonic(), 0.0)


def case_id(test_id: str, direction: str) -> str:
    """A (shape, direction) case: the shape id, with ``@<direction>`` appended unless it is forward."""
    shape = records.shape_id(test_id, FRAMEWORK)
    return shape if direction == FORWARD else f"{shape}@{direction}"


def direction_of(case: str) -> str:
    return case.rpartition("@")[2] if "@" in case else FORWARD


def cases_from_records(found: Iterable[tuple[str, str, object]]) -> tuple[dict, dict, dict, str | None]:
    """``(medians, test_ids, kernel_names, problem)`` from the report's records, every direction a case."""
    medians: dict[str, float] = {}
    test_ids: dict[str, str] = {}
    names: dict[str, str] = {}
    for nodeid, outcome, value in found:
        if outcome != "passed":
            continue
        try:
            parsed = records.parse_benchmark(nodeid, value, outcome=outcome)
        except records.RecordError as exc:
            return {}, {}, {}, f"unreadable record: {exc}"
        for rec in parsed:
            if rec.framework != FRAMEWORK:
                continue
            case = case_id(rec.test_id, rec.direction)
            if case in medians:
                return {}, {}, {}, f"two records for case {case} ({test_ids[case]} and {rec.test_id})"
            try:
                medians[case] = float(rec.stats["median"])
            except (KeyError, TypeError, ValueError):
                return {}, {}, {}, f"case {case}: no numeric median in its record"
            test_ids[case] = rec.test_id
            if isinstance(rec.stats.get("kernel_name"), str):
                names[case] = rec.stats["kernel_name"]
    return medians, test_ids, names, None


def witness_problem(found: Iterable[tuple[str, str, object]]) -> str | None:
    """The first record whose median its own device-time witness contradicts (``rules.witness_shortfall``).

    Records without ``device_ms`` (the target's own timer, or no CUPTI) are not cross-checked."""
    for nodeid, outcome, value in found:
        if outcome != "passed":
            continue
        try:
            parsed = records.parse_benchmark(nodeid, value, outcome=outcome)
        except records.RecordError:
            continue  # cases_from_records reports it
        for rec in parsed:
            device_ms = rec.stats.get("device_ms")
            if not isinstance(device_ms, (int, float)) or not isinstance(rec.stats.get("median"), (int, float)):
                continue
            why = rules.witness_shortfall(float(rec.stats["median"]), float(device_ms))
            if why:
                return f"{rec.test_id} ({rec.framework}): {why}"
    return None


# --- which code ran -----------------------------------------------------------------------------


def origin_problem(modules: dict[str, str], checkout_root: Path, fenced_files: Iterable[str],
                   require_import: bool) -> str | None:
    """Why the run did not measure the checkout's fenced code, or None."""
    # The fenced Python files by module name, as the checkout imports them.
    expected = {name: rel for rel in fenced_files if (name := pristine.module_name(checkout_root, rel))}
    imported = {name: modules[name] for name in expected if name in modules}
    for name, file in sorted(imported.items()):
        if not pristine.is_inside(file, checkout_root):
            return f"module {name} was imported from {file}, not from the candidate's checkout"
    if require_import and expected and not imported:
        return (f"none of the fenced modules ({', '.join(sorted(expected))}) was imported: the tests ran "
                "some other code")
    return None


def defined_names(root: Path, fenced_files: Iterable[str]) -> set[str]:
    """Every function and class name the fenced Python files define (the kernels among them)."""
    names: set[str] = set()
    for rel in fenced_files:
        if not rel.endswith(".py"):
            continue
        try:
            tree = ast.parse(safe_read.read_bytes(root / rel, FENCED_LIMIT))
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        names |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return names


# A fenced file the harness parses is refused above this size (``kernel.probes.MAX_SOURCE_BYTES`` too).
FENCED_LIMIT = safe_read.MB
# How much of each shard child's log is joined into the stage's log (its end, where pytest's summary is).
SHARD_LOG_LIMIT = 64 * safe_read.MB


# --- the stage ------------------------------------------------------------------------------------


def _rel(session: Session, path: Path) -> str:
    return str(path.relative_to(session.repo))


# The run's private folder (report, bytecode, the child's HOME and TMPDIR) in the temp folder.
RUN_PREFIX = "cutile-perf-run-"


def run_stage(session: Session, name: str, tag: str, deadline: Deadline, *, checkout: pristine.Checkout,
              fenced_files: list[str], tracked: list[str], on_start: Callable[[int], None] | None = None,
              gate: runner.Gate | None = None, select: list[str] | None = None,
              start: runner.StartGate | None = None, preload: Sequence[str] = ()) -> Stage:
    """Run the ``name`` command ("correctness" or "perf") once in ``checkout``; with ``gate``, the
    child waits on it before its first test (``child.pool``: until the spare beside it waits);
    with ``start``, it is a spare child, started ahead of its turn, and waits on it before any code
    of the repository runs (``child.warmstart``; the stage is then timed from ``start.open()``);
    with ``select``, it runs only those node ids of the command's selection (``CUTILE_PERF_SELECT``:
    an interleaved re-check run of the cases in doubt); ``preload``: the installed modules a spare
    child imports while it waits (``CUTILE_PERF_PRELOAD``)."""
    runs = session.sandbox / "runs"
    output = runs / f"{tag}-{name}.log"
    if deadline.left() <= 0:
        if gate is not None:
            gate.unused()
        if start is not None:
            start.unused()
        return Stage(name, CrashClass.TIMEOUT, 0.0, _rel(session, output), detail="no time left in the iteration budget",
                     ended=False)
    try:
        with remove_tree.temporary_folder(RUN_PREFIX) as private:
            return _run_stage(session, name, tag, deadline, checkout, fenced_files, tracked, on_start, output,
                              private, gate, select, start, preload)
    except BaseException:
        if start is not None and not start.handed:  # it never reached the runner, which closes them
            start.unused()
        raise


def _run_child(session, name, deadline, checkout, fenced_files, on_start, output: Path, private: Path,
               shard: tuple[int, int] | None = None, gate: runner.Gate | None = None,
               select: list[str] | None = None, start: runner.StartGate | None = None,
               preload: Sequence[str] = (), extra_env: dict[str, str] | None = None,
               ) -> tuple[runner.RunResult, runreport.RunReport, Path]:
    """One pytest child of the stage (one share of the tests when ``shard`` is given): its result,
    its verified run report, and the report file (kept next to the log by the caller).
    ``extra_env``: more harness values (the reference child of checked timed calls, ``child.checkrun``)."""
    report_file = private / "report.jsonl"
    key = runreport.new_key()
    overrides = {"CUTILE_PERF_REPORT": str(report_file), **(extra_env or {})}
    # checked timed calls (child.checked), unless switched off to measure what they cost
    if name == "perf" and shard is None and not extra_env and not knobs.timed_calls_unchecked():
        (private / CHECK_FOLDER).mkdir(exist_ok=True)
        overrides["CUTILE_PERF_CHECK_DIR"] = str(private / CHECK_FOLDER)
    if session.defence:
        overrides["CUTILE_PERF_DEFENCE"] = "1"
    if shard is not None:
        overrides["CUTILE_PERF_SHARD"] = f"{shard[0]}/{shard[1]}"
    if select:
        overrides["CUTILE_PERF_SELECT"] = json.dumps(sorted(select))
    if start is not None and preload:
        overrides["CUTILE_PERF_PRELOAD"] = json.dumps(list(preload))
    if checkout.compile_cache is not None:
        overrides[jitcache.ENV] = str(checkout.compile_cache)
    boxed = box_why_not(session) is None
    # A boxed child reads the installed-code bytecode the harness compiled (``child.bytecode``),
    # which its box shows read-only; with the prefix set, no ``__pycache__`` in the checkout is
    # read either, so shares of a sharded stage cannot plant bytecode for one another. Without it,
    # installed packages' own bytecode only for a boxed child alone in its checkout (``child_env``):
    # the shares of a sharded stage run at once in one checkout, where one could plant bytecode
    # for another after the sweep; an unboxed child could write into any __pycache__.
    shared = checkout.installed_bytecode if boxed else None
    if shared is not None:
        pycache = shared
    elif boxed and shard is None:
        pycache = None
    else:
        pycache = private / "pycache"
    env = pristine.child_env(checkout.root, fenced_files, pycache,
                             {**overrides, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    argv = [*session.argv(name), *records.PYTEST_PLUGIN_ARGS]
    # In the box every value the harness sets is passed (its environment is an allow-list, not a
    # copy of ours); the paths in them are rewritten to the box's fixed paths by the runner.
    the_box = box.for_stage(session.repo, checkout.root, private, checkout.compile_cache,
                            read_only=(shared,) if shared is not None else ()) if boxed else None
    result = runner.run(argv, cwd=checkout.root, timeout_s=deadline.left(), output_path=output,
                        env_overrides=env if the_box else {k: v for k, v in env.items() if v != os.environ.get(k)},
                        secret=key, on_start=on_start, gate=gate, box=the_box, start=start)
    report = runreport.read(report_file, key)
    if the_box is not None:
        # The child names its modules' files by their box paths: the origin check wants the host's.
        report = replace(report, modules={name: the_box.to_host(file) for name, file in report.modules.items()})
    return result, report, report_file


def box_why_not(session: Session) -> str | None:
    """Why this session's children run unboxed (``box.decide``), or None: in the box."""
    return box.decide(getattr(session, "sandbox_mode", "auto"))


def _run_shards(session, name, deadline, checkout, fenced_files, on_start, output: Path, private: Path,
                count: int) -> tuple[runner.RunResult, runreport.RunReport, tuple[CrashClass, str] | None]:
    """``count`` children at once, each running one share of the selected tests; their logs are
    joined into ``output`` (shard by shard) and their reports merged. Returns the result that
    speaks for the stage (the first crash, else the slowest child), the merged report, and the
    integrity failure, if any: a split that does not add up (``runreport.merge_shards``) is no
    evidence, since tests may have gone unrun; a child that imported the fenced code from
    elsewhere measured the wrong code."""
    def one(index: int):
        folder = private / f"shard-{index}"
        folder.mkdir()
        log = output.with_name(f"{output.stem}.shard{index}{output.suffix}")
        return _run_child(session, name, deadline, checkout, fenced_files, on_start, log, folder, (index, count))

    with ThreadPoolExecutor(max_workers=count) as pool:
        children = list(pool.map(one, range(count)))
    with open(output, "wb") as joined:
        for index, (result, _report, report_file) in enumerate(children):
            joined.write(f"===== cutile-perf: shard {index + 1} of {count} =====\n".encode())
            safe_read.copy_into(result.output_path, joined, SHARD_LOG_LIMIT)  # in chunks, never whole
            result.output_path.unlink(missing_ok=True)
            keep_report(report_file, output.with_name(f"{output.stem}.shard{index}.report.jsonl"))
    merged, split_problem = runreport.merge_shards([report for _result, report, _file in children])
    # A share can be empty (fewer tests than children): pytest then exits with "no tests", which
    # is no crash here; the split check counts what every share ran.
    ran = [c for c in children if not (c[1].ended and c[1].shard and c[1].shard["mine"] == 0
                                       and c[0].returncode == runner.PYTEST_NO_TESTS)] or children
    crashed = [c for c in ran if runner.classify(c[0], c[1].failures.values()) is not None]
    speaker = crashed[0][0] if crashed else max((c[0] for c in ran), key=lambda r: r.duration_s)
    problem = None
    # A crashed child already fails the stage with its own class (compile, fault, ...); "no tests"
    # is the exception: children that were steered off their shares also end with it.
    if all(runner.classify(c[0], c[1].failures.values()) in (None, CrashClass.NO_TESTS) for c in crashed):
        problem = (CrashClass.INCOMPLETE_TESTS, split_problem) if split_problem else None
        for index, (_result, report, _file) in enumerate(children):
            # Imports are checked child by child: a merged table could hide one child's stray import.
            # An empty share may never have needed the fenced modules (tests that import lazily).
            stray = origin_problem(report.modules, checkout.root, fenced_files,
                                   require_import=report.ended and bool(report.outcomes))
            if problem is None and stray:
                problem = (CrashClass.MEASURED_WRONG_CODE, f"shard {index + 1}: {stray}")
    result = replace(speaker, output_path=output, duration_s=max(c[0].duration_s for c in children))
    return result, merged, problem


def _run_stage(session, name, tag, deadline, checkout, fenced_files, tracked, on_start, output, private,
               gate=None, select=None, start=None, preload=()) -> Stage:
    before_user = protected.snapshot(session.repo, protected.protected_paths(session, tracked))
    # The committed files only: caches and outputs the tests create (.pytest_cache, logs) are theirs.
    checkout_files = list(checkout.written)
    released: dict[str, dict] = {}

    def at_release() -> None:
        pristine.sweep(checkout)  # what an earlier child of this checkout left never reaches this one
        released["checkout"] = protected.digest_tree(checkout.root, checkout_files)

    # A child started ahead of its turn may share its checkout with the child running now (the
    # same commit's previous run): it reads nothing of it until let go, so the checkout is swept
    # and fingerprinted then, once that child has ended.
    if start is None:
        at_release()
    else:
        start.on_open(at_release)

    shard_integrity = None
    if name == "correctness" and session.correctness_jobs > 1:
        result, report, shard_integrity = _run_shards(session, name, deadline, checkout, fenced_files, on_start,
                                                    output, private, session.correctness_jobs)
        report_file = None
    else:
        result, report, report_file = _run_child(session, name, deadline, checkout, fenced_files, on_start,
                                                 output, private, gate=gate, select=select, start=start,
                                                 preload=preload)
        if start is not None and start.opened_at is None:
            # A spare child never let go (the run was not asked for, or the command ended): it
            # timed nothing, so no log of a run that did not happen is left.
            output.unlink(missing_ok=True)
            report_file = None
        # A spare child's own stage begins when it is let go; its start-up overlapped another run
        # (the correctness run, or the run before it) and is not counted twice.
        if start is not None and start.opened_at is not None:
            result = replace(result, duration_s=max(time.monotonic() - start.opened_at, 0.0))

    touched_user = protected.put_back_changed(session, tag, before_user)
    touched_checkout: list[str] = []
    before_checkout = released.get("checkout")
    if before_checkout is not None:  # else never let go (cancelled while it waited): it ran nothing there
        after_checkout = protected.digest_tree(checkout.root, checkout_files)
        touched_checkout = sorted(p for p in checkout_files if after_checkout[p] != before_checkout[p])
    if report_file is not None:
        keep_report(report_file, output.with_suffix(".report.jsonl"))
    if name == "perf":
        _keep_checked_calls(private / CHECK_FOLDER, output.with_suffix(".checked"))

    crash = runner.classify(result, report.failures.values())
    detail = failure_detail(result, report) if crash else ""
    if result.timed_out:
        detail = f"killed after the iteration budget of {deadline.budget:g} s"
    shapes, test_ids, kernel_names = {}, {}, {}
    integrity = (_tamper_problem(name, tag, report, touched_user, touched_checkout) or shard_integrity
                 or (_origin_integrity(report, checkout, fenced_files) if crash is None else None))
    if integrity:
        crash, detail = integrity
    elif name == "perf" and crash is None:
        shapes, test_ids, kernel_names, problem = cases_from_records(report.records)
        crash, detail = _record_problem(report, problem, shapes) or (crash, detail)
    # Only a perf run's imports are ever read (the baseline's perf runs teach the preloads).
    imports = warmstart.installed_imports(report.modules, [checkout.root, private]) if name == "perf" else []
    not_passed = {n: o for n, o in report.outcomes.items() if o != "passed"}
    return Stage(name, crash, result.duration_s, _rel(session, output), shapes, test_ids, kernel_names, detail,
                 ended=report.ended, passed=frozenset(report.passed()), not_passed=not_passed,
                 sandbox=box.label(box_why_not(session)), imports=tuple(imports), checked=tuple(report.checked))


def _keep_checked_calls(captured: Path, kept: Path) -> None:
    """A perf child's checked timed calls, kept beside its log for the reference child (child.checkrun).
    Links are copied as links and FIFOs or devices left out: copying must not hang on what the child
    left there, and the digests in its signed report catch any file that is not its own."""
    if not captured.is_dir() or not any(captured.iterdir()):  # a spare ended before it ran: nothing captured
        return
    try:  # the same filesystem: moved, not copied (a capture can be gigabytes)
        os.rename(captured, kept)
    except OSError:
        shutil.copytree(captured, kept, symlinks=True, dirs_exist_ok=True, ignore=_not_plain)


def _tamper_problem(name, tag, report, touched_user, touched_checkout) -> tuple[CrashClass, str] | None:
    """The child changed a protected file, forged report lines or replaced timing functions: the
    stage is ``tampered`` whatever else it shows."""
    if touched_user or touched_checkout:
        which = touched_user or [f"(checkout) {p}" for p in touched_checkout]
        return (CrashClass.TAMPERED, f"protected file(s) changed during the {name} run: {', '.join(which[:5])}"
                + (f" (restored; the changed copies are in sandbox/tampered/{tag}/)" if touched_user else ""))
    if report.forged:
        return CrashClass.TAMPERED, f"the run report has lines the plugin did not write: {report.forged[0]}"
    if report.tampered:
        return (CrashClass.TAMPERED, f"timing or reporting functions were replaced in the {name} run: "
                + "; ".join(report.tampered[:3]))
    return None


def _origin_integrity(report, checkout, fenced_files) -> tuple[CrashClass, str] | None:
    problem = origin_problem(report.modules, checkout.root, fenced_files, require_import=report.ended)
    return (CrashClass.MEASURED_WRONG_CODE, problem) if problem else None


def _record_problem(report, problem: str | None, shapes: dict) -> tuple[CrashClass, str] | None:
    """Why a passing perf run's records are no evidence: contradicted by the device-time witness,
    malformed (``problem``, from ``cases_from_records``), or missing."""
    if witnessed := witness_problem(report.records):
        return CrashClass.TAMPERED, f"timing contradicted by the device-time witness: {witnessed}"
    if problem:
        return CrashClass.BAD_RECORD, problem
    if not shapes and report.ended:
        return CrashClass.NO_RECORD, (f"the perf command passed but recorded no '{FRAMEWORK}' benchmark "
                                      "(does the perf test call record_property('benchmark', ...)?)")
    return None


def _not_plain(folder: str, names: list[str]) -> list[str]:
    """The entries of ``folder`` that are neither files, folders nor links (for ``shutil.copytree``)."""
    kinds = (stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK)
    return [n for n in names if not any(k(os.lstat(os.path.join(folder, n)).st_mode) for k in kinds)]


def keep_report(report_file: Path, kept: Path) -> None:
    """Copy a child's run report next to its log (in chunks; a FIFO, device or link in its place is
    not read, and a note says so)."""
    if not os.path.lexists(report_file):
        return
    with open(kept, "wb") as out:
        safe_read.copy_into(report_file, out, runreport.REPORT_LIMIT)


def failure_detail(result: runner.RunResult, report: runreport.RunReport) -> str:
    """What the row says of a failed child: the run report's message of the first failed test,
    else pytest's failure lines found from the end of the output, else its last lines; and, when
    the output is too long for its end to be all of it and nothing named the failure, that the
    failure could not be found."""
    # The failed test's node id first: what a reader (and ``verify --full-tests``) looks for.
    named = [f"{nodeid.rpartition('::')[2]}: {message}" for nodeid, message in list(report.failures.items())[:1]] \
        or result.failure_lines()[-3:]
    if named:
        return " | ".join(" ".join(line.split()) for line in named)[:400]
    size = safe_read.size_of(result.output_path)
    last = _last_lines(result.tail())
    if size > 1_000_000:
        return (f"the failure was not found: nothing in the run report nor in the {size / safe_read.MB:.0f} MB of "
                f"output names it; the output ends: {last}")[:400]
    return last


def _last_lines(text: str, count: int = 3) -> str:
    """The most telling lines of a pytest failure: error lines first, else the last lines."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E ") or "Error" in ln]
    chosen = errors[-count:] if errors else lines[-count:]
    return " | ".join(chosen)[:400]
