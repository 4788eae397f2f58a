"""pytest plugin: collect the ``benchmark`` records of perf tests, print them, save them as JSON lines.

TileGym-shaped perf tests call ``record_property("benchmark", {"cutile": {"forward": {...}}})``.
pytest keeps those pairs on each test report (``report.user_properties``); this plugin reads them
from the reports of the *call* phase, so it also works under pytest-xdist, where only the
controller's reports are used (workers write nothing, or every record would land twice).

* ``--print-record``: prints ``Cutile: {'forward': {...}} ms`` lines (one per framework per test,
  under the test's node id) in a terminal-summary section.
* ``CUTILE_PERF_RECORDS=<file>`` (set by the harness): appends one JSON line per recording test,
  ``{"nodeid": ..., "outcome": "passed", "benchmark": {...}}``; ``records.read_records_file`` reads it.

* ``CUTILE_PERF_RECORD_LAUNCHES=<file>`` (set by ``compile-check --record``): each distinct
  ``ct.launch`` signature is appended to the file (``launch_record``).

* ``CUTILE_PERF_REPORT=<file>`` (set by the harness): the signed run report (``runreport``): each
  test's outcome, each benchmark record, the file every imported module came from, and an
  end-of-session marker. Lines are numbered and signed with a key passed through a pipe
  (``CUTILE_PERF_KEY_FD``), so lines appended by anyone else, or a run that died before its end
  (``os._exit``), are told apart from what this plugin saw.

* ``CUTILE_PERF_SHARD=i/k`` (set by the harness, with the report): after collection and ``-k``,
  the child keeps every k-th of the selected tests in node-id order, starting at i, and reports
  how many were selected and a digest of their ids, so the harness can check that k children ran
  k disjoint shares of one and the same selection.

* ``CUTILE_PERF_SELECT=<JSON list of node ids>`` (set by the harness, with the report): after
  collection and ``-k``, the child keeps only those tests: an interleaved re-check run of the
  cases in doubt. Read when this module loads, before the target's code could change it.

* ``CUTILE_PERF_GATE_FD`` (set by the harness for a perf child timed while a spare child starts
  beside it, ``child.pool``): after collection, before the first test, the child waits for one
  byte on that descriptor; end of file means the run was cancelled, and the child stops without
  running a test.

* Timer identity (issue 19 item 4; ``pytest_plugin.identity``): when this module loads, before
  any conftest or test module (and so before the candidate's kernel) is imported, it takes the
  identity of every function a measurement or its report goes through; after collection and at the
  end of the session each replacement is written to the run report as a ``tampered`` line and the
  original is put back. What it cannot detect, and why, is listed there.

Loading: installed, the ``pytest11`` entry point loads it; the harness also passes
``-p cutile_perf.pytest_plugin`` so a target venv without our entry point works too.

``--print-record`` trap: entry-point plugins load *before* conftest files, and TileGym's conftest
registers ``--print-record`` itself; registering it in our ``pytest_addoption`` would make that
conftest fail with "option names {'--print-record'} already added". So the option is added after
the initial conftests have loaded, and only when nobody registered it: it exists exactly once.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib  # noqa: F401 - hashlib, hmac, statistics, time, _pytest.*, bench, stats: imported at load so
import hmac  # noqa: F401   that TimerIdentity captures them before any test module exists
import json
import os
import statistics  # noqa: F401
import sys
import threading
import time  # noqa: F401
from typing import Any

import _pytest.reports  # noqa: F401
import _pytest.runner  # noqa: F401
import pytest

from cutile_perf import bench, knobs  # noqa: F401
from cutile_perf.child import checked, runreport
from cutile_perf.judge import stats  # noqa: F401
from cutile_perf.child.records import BENCHMARK_PROPERTY, RecordError, format_print_record_line, parse_benchmark
from cutile_perf.pytest_plugin.identity import TimerIdentity

PRINT_RECORD_OPTION = "--print-record"
RECORDER_NAME = "cutile-perf-recorder"


def _option_names(parser: pytest.Parser) -> set[str]:
    # pytest has no public "is this option registered?" call; its groups are the registry, and
    # looking at all of them also catches an option registered in a named group.
    groups = getattr(parser, "_groups", [])
    return {name for group in groups for option in group.options for name in option.names()}


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]):
    yield  # the initial conftests (TileGym's tests/conftest.py) register their options here
    if PRINT_RECORD_OPTION not in _option_names(parser):
        parser.addoption(
            PRINT_RECORD_OPTION,
            action="store_true",
            default=False,
            dest="cutile_perf_print_record",
            help="print the benchmark records of perf tests (Cutile: {...} ms), added by cutile-perf",
        )


def pytest_runtest_setup(item) -> None:
    checked.begin_test(item.nodeid)


REPORTER_NAME = "cutile-perf-run-report"
GATE_NAME = "cutile-perf-gate"
# Read at import, before any conftest or test module (and the kernel they import) exists.
_REPORT_KEY = knobs.take_report_key()
_GATE_FD = knobs.take_gate_fd()
_SELECT = knobs.take_selection()
_CHECK = knobs.take_check_setup()
if _CHECK is not None:
    checked.configure(*_CHECK)


def pytest_configure(config: pytest.Config) -> None:
    launches = knobs.launches_path()
    if launches is not None:  # compile-check --record: before any test module imports the kernel
        from cutile_perf.kernel import launch_record  # noqa: PLC0415

        launch_record.install(launches)
    if not config.pluginmanager.has_plugin(RECORDER_NAME):
        config.pluginmanager.register(BenchmarkRecorder(config), RECORDER_NAME)
    if _GATE_FD is not None and not hasattr(config, "workerinput") and not config.pluginmanager.has_plugin(GATE_NAME):
        config.pluginmanager.register(Gate(_GATE_FD), GATE_NAME)
    path = knobs.report_path()
    if path is not None and not hasattr(config, "workerinput") and not config.pluginmanager.has_plugin(REPORTER_NAME):
        reporter = RunReporter(path, _REPORT_KEY or b"", knobs.shard(), _IDENTITY, _SELECT)
        config.pluginmanager.register(reporter, REPORTER_NAME)
        if checked.SETUP is not None:  # checked lines go into the signed report
            checked.SETUP.write = functools.partial(runreport.Writer.write, reporter.writer)


# How long the first test waits for the profiler's warm-up (``Gate``); past it the test runs and its
# record's witness pays what is left of the set-up, as it would without the warm-up.
WARM_UP_WAIT_S = 120.0


class Gate:
    """Holds a perf child between collection and its first test, until the spare child started
    beside it waits (``child.pool``): no test, and so no timing, starts before the harness says so.

    The profiler's one-off set-up (CUPTI and Kineto: seconds, ``docs/results/2026-12-02-h200-speed.md``,
    section 1) would otherwise be paid
    inside the first record's witness. It runs in a thread from the moment the plugin is configured,
    beside collection (torch's profiler preparation releases the GIL), and the first test waits for
    it: it runs no test, times nothing, and is over before anything is timed. Not on a host without
    a GPU (``bench.cuda_host``), where it would import torch for nothing."""

    def __init__(self, fd: int):
        self.fd = fd
        self._warm_up: threading.Thread | None = None
        if not bench.cuda_host():
            return
        try:
            import torch  # noqa: F401, PLC0415 - in this thread: two threads importing torch at once can deadlock
        except ImportError:
            return
        self._warm_up = threading.Thread(target=bench.warm_up_profiler, name="cutile-perf-profiler-warm-up", daemon=True)
        self._warm_up.start()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        if self._warm_up is not None:
            self._warm_up.join(WARM_UP_WAIT_S)
        received = bytearray()
        try:
            while chunk := os.read(self.fd, 65536):
                received += chunk
        except OSError:
            received.clear()
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)
        if received[:1] != b"1":
            pytest.exit("cutile-perf: perf run cancelled before its first test", returncode=pytest.ExitCode.INTERRUPTED)


def keep_selected(config: pytest.Config, items: list, select: frozenset[str]) -> None:
    """Narrow ``items`` to the node ids ``select`` names (``CUTILE_PERF_SELECT``), in place.

    A filter, not a selection of its own: only tests the command selects can run. A node id it does
    not select runs nowhere, and its case's missing record fails the run."""
    dropped = [item for item in items if item.nodeid not in select]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = [item for item in items if item.nodeid in select]


class RunReporter:
    """Writes the signed run report the harness judges a stage by (``runreport.read``)."""

    def __init__(self, path, key: bytes, shard: tuple[int, int] | None = None,
                 identity: TimerIdentity | None = None, select: frozenset[str] | None = None):
        self.writer = runreport.Writer(path, key)
        self.outcomes: dict[str, str] = {}
        self.shard = shard
        self.select = select
        self.identity = identity
        self._writer, self._write = self.writer, runreport.Writer.write

    def check_identity(self, when: str) -> None:
        """Timer identity: write every replaced timing or reporting function as a ``tampered`` line."""
        findings = self.identity.check(when) if self.identity is not None else []
        if self.writer is not self._writer or "write" in vars(self._writer):
            findings.append(f"the plugin's report writer was replaced ({when})")
            self.writer = self._writer
            vars(self._writer).pop("write", None)
        if findings:
            self._write(self.writer, {"type": "tampered", "findings": findings})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.check_identity("after collection")

    @pytest.hookimpl(trylast=True)  # after -k/-m deselection: narrow or shard what the command selects
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        if self.select is not None:
            keep_selected(config, items, self.select)
        if self.shard is None:
            return
        index, count = self.shard
        ordered = sorted(item.nodeid for item in items)
        mine = set(ordered[index::count])
        kept = [item for item in items if item.nodeid in mine]
        dropped = [item for item in items if item.nodeid not in mine]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        self.writer.write({"type": "shard", "index": index, "count": count, "selected": len(ordered),
                           "digest": runreport.ids_digest(ordered), "mine": len(kept)})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = runreport.outcome_of(report.when, report.outcome, hasattr(report, "wasxfail"))
        if outcome is None:
            return
        previous = self.outcomes.get(report.nodeid)
        # The worst phase wins: a passing call with a failing teardown is not a pass.
        if previous is None or runreport.OUTCOME_RANK[outcome] > runreport.OUTCOME_RANK[previous]:
            self.outcomes[report.nodeid] = outcome
            line = {"type": "test", "nodeid": report.nodeid, "outcome": outcome}
            if outcome in ("failed", "error"):
                line["failure"] = failure_message(report)
            self.writer.write(line)
        if report.when == "call":
            for name, value in report.user_properties:
                if name == BENCHMARK_PROPERTY:
                    self.writer.write({"type": "record", "nodeid": report.nodeid, "outcome": report.outcome,
                                       "benchmark": _jsonable(value)})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus) -> None:
        self.check_identity("at the end of the session")
        modules = {}
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if isinstance(file, str):
                modules[name] = file
        self.writer.write({"type": "modules", "files": modules})
        self.writer.write({"type": "end", "exitstatus": int(exitstatus), "collected": session.testscollected})


def failure_message(report: pytest.TestReport) -> str:
    """Why a test failed, in a few lines (pytest's crash message: ``AssertionError: ...``): the
    harness classifies the failure from it even when the test's output is too long to search."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if not isinstance(message, str):
        message = str(report.longrepr)[-runreport.FAILURE_CHARS:]
    return message[:runreport.FAILURE_CHARS]


class BenchmarkRecorder:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.collected: list[tuple[str, Any]] = []
        # An xdist worker forwards its reports to the controller, which records them.
        self.is_worker = hasattr(config, "workerinput")
        self.records_path = None if self.is_worker else knobs.records_path()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker or report.when != "call":
            return
        for name, value in report.user_properties:
            if name != BENCHMARK_PROPERTY:
                continue
            self.collected.append((report.nodeid, value))
            if self.records_path is not None:
                self._append(report.nodeid, report.outcome, value)

    def _append(self, nodeid: str, outcome: str, value: Any) -> None:
        line = json.dumps({"nodeid": nodeid, "outcome": outcome, "benchmark": value}, default=_json_scalar)
        self.records_path.parent.mkdir(parents=True, exist_ok=True)
        # One write of a whole line in append mode: a kill can cut the last line, never interleave.
        with open(self.records_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.is_worker or not self.collected or not self.config.getoption(PRINT_RECORD_OPTION, default=False):
            return
        terminalreporter.write_sep("-", "benchmark records (ms)")
        for nodeid, value in self.collected:
            terminalreporter.write_line(nodeid)
            for line in _print_lines(nodeid, value):
                terminalreporter.write_line(f"  {line}")


def _print_lines(nodeid: str, value: Any) -> list[str]:
    try:
        records = parse_benchmark(nodeid, value)
    except RecordError as exc:
        return [f"(unreadable benchmark record: {exc})"]
    by_framework: dict[str, dict] = {}
    for record in records:
        by_framework.setdefault(record.framework, {})[record.direction] = record.stats
    return [format_print_record_line(fw, directions) for fw, directions in by_framework.items()]


def _json_scalar(value: Any) -> Any:
    """numpy/torch scalars recorded by a test become plain numbers; anything else its text."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else str(value)


def _jsonable(value: Any) -> Any:
    """A record as plain JSON data (numpy/torch scalars become numbers)."""
    return json.loads(json.dumps(value, default=_json_scalar))


# Last, so that this module's own functions exist; still at load, before any conftest or test module.
# The child runs in the target's checkout: its working directory is the root of the test tree.
_IDENTITY = TimerIdentity.at_load(watch_imports=knobs.report_path() is not None,
                                  root=os.path.realpath(os.getcwd()))
