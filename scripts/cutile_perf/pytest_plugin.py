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

* Timer identity (issue 19 item 4): when this module loads, before any conftest or test module
  (and so before the candidate's kernel) is imported, it takes the identity of every function a
  measurement or its report goes through (``WATCHED``: ``time.perf_counter``/``_ns``,
  ``time.monotonic``, ``statistics.median``/``mean``, ``json.dumps``, ``hmac.new``, ``cutile_perf.bench``
  and ``judge.stats``, ``runreport``'s writer and signer, this plugin's own writers, pytest's
  ``TestReport`` and the ``_pytest.reports``/``_pytest.runner`` functions that build the reports,
  ``torch.cuda.Event``/``elapsed_time``/``record``/``synchronize``, the ``torch.profiler`` path that
  CUPTI timings go through (TileGym's default timer and ``bench``'s device-time witness),
  ``triton.testing.do_bench``, and the module objects themselves, so a fake ``sys.modules["time"]``
  counts too). The target's own test tree is watched the same way: every function and class (and
  class function) that a module of it defines (``tests.common`` holds TileGym's timer), captured the
  moment that module's code has run, so before the candidate can reach it; a test module imported
  behind the hook's back is a finding. For Python functions the code object is captured as well:
  assigning ``f.__code__`` keeps ``f`` the same object and changes what it does. torch and triton
  are not imported for this (1 s and more per child, most of which never time anything): an
  import hook at the head of ``sys.meta_path`` takes their identities the moment their own import
  finishes, before the importer's next statement runs; a torch found in ``sys.modules`` that did not
  pass the hook is itself a finding. After collection (the kernel is imported by then) and at the
  end of the session, before the end marker is signed, each current object is compared with the
  captured one (``is``); every replacement is written to the run report as a ``tampered`` line
  naming the attribute (the harness turns it into crash class ``tampered``), and the original is
  put back so that what follows, the report writer included, runs on the real functions.

  What this cannot detect, and why:

  - patches outside Python attributes: a C extension or ``LD_PRELOAD`` that hooks ``cudaEventElapsedTime``,
    ``clock_gettime`` or the driver; the check compares Python objects only;
  - a patch applied and undone between the two checks (inside a test, or around each timed
    call): only the state at the check points is seen;
  - a kernel that does less work only when timed without touching any timer (it counts its calls,
    or probes the context: ``kernel/probes.py`` refuses the known probes from the source, and
    the interleaved re-measurement and ``verify`` remain the backstop);
  - rebinding a name that a module outside the test tree imported (``helper.perf_counter = fake``
    after it did ``from time import perf_counter``), patches of instances (one ``Event`` object's
    method: ``bench``'s device-time witness is the check for that), of functions not in ``WATCHED``,
    of data (``tests.common.Config.cupti = False``), or of a C function's behaviour;
  - code in the same process that finds this plugin's captured references (``gc.get_referrers``,
    the module's globals) and replaces the originals there as well, or removes the checker: the
    check raises the bar from "assign an attribute" to "rewrite the harness's memory", like the
    report's signature; it does not make the process trustworthy;
  - under pytest-xdist only the controller is checked (its workers write no report);
  - a hook installed ahead of ours that patches torch while torch itself is being imported (its
    patched objects are what is captured).

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
import importlib.util
import inspect
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


# --- timer identity (module docstring) ---------------------------------------------------------

# module -> dotted attributes under it whose identity is captured at load and checked later.
WATCHED: dict[str, tuple[str, ...]] = {
    "time": ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time"),
    "statistics": ("median", "mean", "fmean", "stdev", "quantiles"),
    "json": ("dumps", "loads", "JSONEncoder.encode", "JSONEncoder.iterencode"),
    "hmac": ("new", "HMAC.hexdigest"),
    "hashlib": ("sha256",),
    "os": ("fsync", "read"),
    "builtins": ("open", "sorted", "min", "max", "sum", "len"),
    "cutile_perf.bench": ("bench", "bench_record", "measure", "_timed", "_batch_times", "_check_escape",
                          "_graph_replay", "_torch", "hidden_work", "plan_counts", "stats", "device_time_ms",
                          "_device_span_ms", "_clone", "OutputCheck", "OutputCheck.refresh", "Measurement",
                          "WrongWhenTimed", "graph_unroll", "sample_bounds", "_fresh_inputs", "_compare_checked",
                          "_call_kernels", "_span_ms", "_kernel_sum_ms", "_profile_call", "_profiled", "check_mode"),
    "cutile_perf.judge.stats": ("median", "mean", "std", "quantile", "summarize", "rel_std_percent", "trimmed_mean"),
    "cutile_perf.child.runreport": ("Writer", "Writer.write", "_sign", "outcome_of", "ids_digest", "OUTCOME_RANK"),
    "cutile_perf.child.records": ("parse_benchmark", "format_print_record_line", "BENCHMARK_PROPERTY"),
    __name__: ("RunReporter", "RunReporter.pytest_runtest_logreport", "RunReporter.pytest_sessionfinish",
               "RunReporter.pytest_collection_modifyitems", "BenchmarkRecorder", "BenchmarkRecorder._append",
               "BenchmarkRecorder.pytest_runtest_logreport", "_jsonable", "_json_scalar", "_print_lines", "json",
               "os", "runreport", "knobs", "BENCHMARK_PROPERTY", "TimerIdentity", "TimerIdentity.check"),
    "pytest": ("TestReport", "hookimpl"),
    "_pytest.reports": ("TestReport", "TestReport.__init__", "TestReport.from_item_and_call", "BaseReport",
                        "BaseReport.passed", "BaseReport.failed", "BaseReport.skipped",
                        "pytest_report_to_serializable", "pytest_report_from_serializable"),
    "_pytest.runner": ("TestReport", "CallInfo", "CallInfo.from_call", "call_and_report", "call_runtest_hook",
                       "runtestprotocol", "pytest_runtest_makereport", "check_interactive_exception"),
    # Imported on demand, never for this check (see _ImportWatch).
    # The CUDA-event path (ours, most targets') and the CUPTI path through torch.profiler (TileGym's
    # default timer, and bench's device-time witness).
    "torch": ("cuda", "cuda.Event", "cuda.Event.elapsed_time", "cuda.Event.record", "cuda.Event.synchronize",
              "cuda.synchronize", "cuda.current_stream", "cuda.graphs", "profiler", "profiler.profile",
              "profiler.profile.__enter__", "profiler.profile.__exit__", "profiler.profile.start",
              "profiler.profile.stop", "profiler.profile.key_averages", "profiler.profile.events",
              "profiler.profiler._KinetoProfile.key_averages",
              "profiler.profiler._KinetoProfile.events", "profiler.profiler._KinetoProfile.start_trace",
              "profiler.profiler._KinetoProfile.stop_trace", "autograd.profiler_util.EventList.key_averages",
              "autograd.profiler_util.FunctionEvent.self_device_time_total",
              "autograd.profiler_util.FunctionEvent.device_time_total", "autograd.profiler_util.FunctionEventAvg.add"),
    "triton.testing": ("do_bench", "do_bench_cudagraph"),
}
LAZY = ("torch", "triton.testing")  # captured when their own import finishes
_MISSING = object()


def is_target_test_module(name: str) -> bool:
    """A module of the target's own test tree, by its import name: ``tests.common``, ``conftest``,
    ``test_rms_norm``. The target's timer lives there (TileGym: ``tests/common.py``), and so does
    what reads it; the fence forbids editing these files, this check forbids patching them in memory."""
    top = name.split(".")[0]
    return top in ("tests", "test", "testing", "conftest") or top.startswith("test_") or top.endswith("_test")


def _resolve(module: str, chain: str = "") -> object:
    """The object ``module.chain`` names now, without binding methods (``getattr_static``)."""
    obj = sys.modules.get(module, _MISSING)
    for part in chain.split(".") if chain else ():
        if obj is _MISSING:
            return _MISSING
        found = inspect.getattr_static(obj, part, _MISSING)
        obj = getattr(obj, part, _MISSING) if found is _MISSING else found
    return obj


def _code_of(value: object) -> object:
    """A Python function's code object (replacing ``__code__`` keeps the function's identity), else None."""
    return value.__code__ if inspect.isfunction(value) else None


def _own_callables(module) -> list[str]:
    """Dotted names of the functions and classes ``module`` defines, and of its classes' functions."""
    chains = []
    for name, value in list(vars(module).items()):
        if not (inspect.isfunction(value) or inspect.isclass(value)) or getattr(value, "__module__", None) != module.__name__:
            continue
        chains.append(name)
        if inspect.isclass(value):
            chains += [f"{name}.{attr}" for attr, member in vars(value).items() if inspect.isfunction(member)]
    return chains


class TimerIdentity:
    """The captured originals and the check (module docstring, "Timer identity")."""

    def __init__(self, root: str | None = None):
        self.captured: dict[str, tuple[str, str, object]] = {}  # label -> (module, chain, original)
        self.codes: dict[str, object] = {}  # label -> the function's original __code__
        self.pending: set[str] = set()  # lazy modules not imported yet
        self.reported: set[str] = set()
        self.watch: _ImportWatch | None = None
        self.root = root  # the target's checkout: its test modules are captured when they are imported
        self.target_modules: set[str] = set()

    def _take(self, module: str, chain: str) -> None:
        label = f"{module}.{chain}" if chain else module
        value = _resolve(module, chain)
        if value is not _MISSING and label not in self.captured:
            self.captured[label] = (module, chain, value)
            code = _code_of(value)
            if code is not None:
                self.codes[label] = code

    def capture(self, module: str) -> None:
        if module not in sys.modules:
            return
        self.pending.discard(module)
        if module == "triton.testing" and checked.SETUP is not None:
            wrap_triton_timers(sys.modules[module])
        for chain in ("", *WATCHED[module]):
            self._take(module, chain)

    def capture_target(self, module) -> None:
        """A module of the target's test tree, right after its own code ran (before its importer's next line)."""
        self.target_modules.add(module.__name__)
        if checked.SETUP is not None:  # wrapped before capture: the wrappers are what is guarded
            wrap_target_timers(module)
        for chain in _own_callables(module):
            self._take(module.__name__, chain)

    def owns_file(self, path: str | None) -> bool:
        if not self.root or not path:
            return False
        with contextlib.suppress(ValueError, OSError):
            return os.path.commonpath([os.path.realpath(path), self.root]) == self.root
        return False

    @classmethod
    def at_load(cls, *, watch_imports: bool, root: str | None = None) -> TimerIdentity:
        identity = cls(root)
        for module in WATCHED:
            if module in sys.modules:
                identity.capture(module)
            elif module in LAZY and importlib.util.find_spec(module.split(".")[0]) is not None:
                identity.pending.add(module)
        if watch_imports:
            identity.watch = _ImportWatch(identity)
            sys.meta_path.insert(0, identity.watch)
        return identity

    def check(self, when: str) -> list[str]:
        """What was replaced since load (each attribute reported once), the originals put back."""
        found: list[tuple[str, str]] = []
        for label, (module, chain, original) in self.captured.items():
            if _resolve(module, chain) is not original:
                found.append((label, f"{label} was replaced ({when})"))
                _restore(module, chain, original)
            elif label in self.codes and _code_of(original) is not self.codes[label]:
                found.append((label, f"{label} had its code replaced ({when})"))
                with contextlib.suppress(Exception):
                    original.__code__ = self.codes[label]
        for module in sorted(self.pending):
            if module in sys.modules:
                found.append((f"import:{module}", f"{module} was imported past the plugin's import hook, its timers "
                                                  f"could not be captured ({when})"))
        for name, module in list(sys.modules.items()):
            if (self.watch is not None and is_target_test_module(name) and name not in self.target_modules
                    and self.owns_file(getattr(module, "__file__", None))):
                found.append((f"import:{name}", f"the target's test module {name} was imported past the plugin's "
                                                f"import hook, its functions could not be captured ({when})"))
        if self.watch is not None and self.watch not in sys.meta_path:
            found.append(("meta_path", f"the plugin's import hook was removed from sys.meta_path ({when})"))
        out = [text for key, text in found if key not in self.reported]
        self.reported.update(key for key, _text in found)
        return out


# --- checked timed calls (child/checked.py) ------------------------------------------------------


def timer_kind(func) -> tuple[str, str]:
    """(method, L2) of a Python function by what its body calls (``target_timing.classify_timer``),
    ("unknown", "unknown") when it is no timer or its source cannot be read."""
    import ast  # noqa: PLC0415
    import textwrap  # noqa: PLC0415

    from cutile_perf.kernel.target_timing import classify_timer  # noqa: PLC0415

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return "unknown", "unknown"
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return "unknown", "unknown"
    return classify_timer(node)


def wrap_target_timers(module) -> list[str]:
    """Replace each timing function ``module`` defines (the target's test tree) by its checked wrapper;
    returns their names. Run the moment the module's code has run, before the tests call them."""
    wrapped = []
    for name, value in list(vars(module).items()):
        if not inspect.isfunction(value) or value.__module__ != module.__name__:
            continue
        method, l2 = timer_kind(value)
        if method != "unknown":
            setattr(module, name, checked.wrap_timer(value, method, l2, f"{module.__name__}.{name}"))
            wrapped.append(name)
    return wrapped


def wrap_triton_timers(module) -> None:
    for name, method, l2 in (("do_bench", "events", "flushed"), ("do_bench_cudagraph", "cuda-graph", "not flushed")):
        timer = getattr(module, name, None)
        if callable(timer):
            setattr(module, name, checked.wrap_timer(timer, method, l2, f"triton.testing.{name}"))


def pytest_runtest_setup(item) -> None:
    checked.begin_test(item.nodeid)


def _restore(module: str, chain: str, original: object) -> None:
    with contextlib.suppress(Exception):
        if not chain:
            sys.modules[module] = original
            return
        *parents, name = chain.split(".")
        owner = _resolve(module, ".".join(parents))
        if owner is not _MISSING:
            setattr(owner, name, original)


class _ImportWatch:
    """Meta-path finder: lets the other finders find a LAZY module or a module of the target's test
    tree, and captures its identities right after the module's own code has run."""

    def __init__(self, identity: TimerIdentity):
        self.identity = identity

    def find_spec(self, name, path=None, target=None):
        lazy = name in self.identity.pending
        if not lazy and not (self.identity.root and is_target_test_module(name)):
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if not lazy and not self.identity.owns_file(spec.origin):
            return spec  # a package of the same name elsewhere (site-packages): not the target's tests
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CapturingLoader(spec.loader, name, self.identity, lazy)
        return spec


class _CapturingLoader:
    def __init__(self, inner, name: str, identity: TimerIdentity, lazy: bool):
        self.inner, self.name, self.identity, self.lazy = inner, name, identity, lazy

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        # The module sees its real loader; only the end of its execution is ours.
        module.__loader__ = self.inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        if self.lazy:
            self.identity.capture(self.name)
        else:
            self.identity.capture_target(module)

    def __getattr__(self, name):
        return getattr(self.inner, name)


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
    it: it runs no test, times nothing, and is over before anything is timed."""

    def __init__(self, fd: int):
        self.fd = fd
        self._warm_up: threading.Thread | None = None
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
