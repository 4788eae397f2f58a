"""Timer identity (issue 19 item 4): the functions a measurement or its report goes through are
captured when the plugin loads and checked after collection and at the end of the session.

When the plugin loads (``TimerIdentity.at_load``, its last line), before any conftest or test
module (and so before the candidate's kernel) is imported, it takes the identity of every function
a measurement or its report goes through (``WATCHED``: ``time.perf_counter``/``_ns``,
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
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import sys

from cutile_perf.child import checked
from cutile_perf.pytest_plugin.checked_timers import wrap_bench, wrap_target_timers, wrap_triton_timers

PLUGIN = "cutile_perf.pytest_plugin"  # the plugin's own module, whose reporters are watched too

# module -> dotted attributes under it whose identity is captured at load and checked later.
WATCHED: dict[str, tuple[str, ...]] = {
    "time": ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time"),
    "statistics": ("median", "mean", "fmean", "stdev", "quantiles"),
    "json": ("dumps", "loads", "JSONEncoder.encode", "JSONEncoder.iterencode"),
    "hmac": ("new", "HMAC.hexdigest"),
    "hashlib": ("sha256",),
    "os": ("fsync", "read"),
    "builtins": ("open", "sorted", "min", "max", "sum", "len"),
    # The bench package: each module's functions by the name its own callers look up (a patch of
    # ``bench.profiler._profile_call`` is not seen through ``bench``'s names).
    "cutile_perf.bench": ("bench", "bench_record", "measure", "_timed", "_batch_times", "_check_escape",
                          "_graph_replay", "_torch", "hidden_work", "plan_counts", "stats", "device_time_ms",
                          "profiled_samples", "clone", "fresh_inputs", "compare_checked", "OutputCheck",
                          "OutputCheck.refresh", "Measurement", "WrongWhenTimed", "graph_unroll", "sample_bounds",
                          "check_mode"),
    "cutile_perf.bench.profiler": ("profiled_samples", "device_time_ms", "_call_kernels", "_span_ms",
                                   "_kernel_sum_ms", "_profile_call", "clone", "fresh_inputs", "compare_checked",
                                   "stats"),
    "cutile_perf.bench.checked_calls": ("OutputCheck", "OutputCheck.refresh", "WrongWhenTimed", "clone",
                                        "fresh_inputs", "compare_checked"),
    "cutile_perf.judge.stats": ("median", "mean", "std", "quantile", "summarize", "rel_std_percent"),
    "cutile_perf.child.runreport": ("Writer", "Writer.write", "_sign", "outcome_of", "ids_digest", "OUTCOME_RANK"),
    "cutile_perf.child.records": ("parse_benchmark", "format_print_record_line", "BENCHMARK_PROPERTY"),
    PLUGIN: ("RunReporter", "RunReporter.pytest_runtest_logreport", "RunReporter.pytest_sessionfinish",
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
        if module == "cutile_perf.bench" and checked.SETUP is not None:
            wrap_bench(sys.modules[module])
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
