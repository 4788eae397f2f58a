"""How the target's perf tests time their kernels, read from their source (``ast``; nothing is run).

The judge's numbers are the target's own perf tests, so what they time decides what a change can
win: with the L2 flushed before each sample a small shape pays its DRAM reads every time, without
the flush (a CUDA graph replaying back-to-back calls) it may read from L2; CUPTI counts kernel time
only, CUDA events also the gaps between launches. ``read`` answers for one perf test file:

* a perf test (or a helper module it imports) that uses ``cutile_perf.bench``: that method, in the
  mode ``CUTILE_PERF_BENCH_MODE`` selects (``cold`` unless set);
* TileGym's shape: the test calls a helper (``common.benchmark_framework``) that reaches a
  dispatcher with ``use_cupti``/``use_cudagraph`` parameters (``common.benchmark``), whose
  ``if use_cupti: ... elif use_cudagraph: ... else: ...`` chain picks a timing function. Each
  flag's value is the call's literal keyword, else the parameter's default; a default read from a
  ``Config`` attribute is looked up in the argparse settings module (TileGym's ``tests/config.py``:
  ``--cupti`` with ``envvar="CUPTI"``, default true), and the environment variable's value, when
  one is set, wins as ``FromEnvironment`` makes it win. Each timing function is classified by what
  its body calls: ``torch.profiler`` (CUPTI), ``torch.cuda.graph`` (graph replay) or CUDA events,
  and whether it zeroes a buffer inside its sample loop (L2 flushed before each sample);
* anything else: "unknown", with what was looked for.

``CLOSEST_BENCH_MODE`` names, for each (method, L2) pair, the ``cutile_perf.bench`` mode that times
the same way, so a figure can be measured again under the target's conditions.

Pure apart from reading files under the repository: the environment is passed in (the values of
``knobs.measurement_env()`` at ``init``, or the baseline's frozen ones for ``status``).
"""
from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

# The flags of a TileGym-style dispatcher, by what they switch on.
_FLAG = {"cupti": re.compile(r"cupti", re.I), "cuda-graph": re.compile(r"cuda_?graph", re.I)}
# Helpers followed from the perf test into the modules it imports, and calls followed inside them.
_MAX_DEPTH = 3

METHODS = {
    "cupti": "CUPTI kernel time (torch.profiler: the kernels' own durations, no launch gaps)",
    "cuda-graph": "CUDA graph replay of back-to-back calls, timed by CUDA events (no launch gaps)",
    "events": "CUDA events around each call (launch gaps included)",
}
# The cutile_perf.bench mode that times each (method, L2) pair the same way (bench's module
# docstring): per sample, the same thing timed with the same flush. What is left different from
# TileGym's timers: its event timer also queues a GPU sleep after the flush, so the call's launches
# are queued before its start event ("cold" has only the flush's own run time ahead of them); its
# flush buffer is 256 MB (ours twice the L2); its CUPTI timer takes as many samples as fill 50 ms
# (bench at most bench.CUPTI_MAX_SAMPLES) and can filter kernels by name (bench sums all of a call's).
CLOSEST_BENCH_MODE = {
    ("cupti", "flushed"): "cupti",
    ("cupti", "not flushed"): "cupti-warm",
    ("events", "flushed"): "cold",
    ("events", "not flushed"): "warm",
    ("cuda-graph", "flushed"): "graph",
    ("cuda-graph", "not flushed"): "graph-warm",
}
BENCH_MODE_L2 = {"cold": "flushed", "warm": "not flushed", "graph": "flushed", "graph-warm": "not flushed",
                 "cupti": "flushed", "cupti-warm": "not flushed"}
BENCH_MODE_METHOD = {
    "cold": "CUDA events around each call", "warm": "CUDA events around each call",
    "graph": "CUDA events around a graph replay of one call (no launch gaps)",
    "graph-warm": "CUDA events around a graph replay of back-to-back calls (no launch gaps)",
    "cupti": "CUPTI kernel time of one profiled call (no launch gaps)",
    "cupti-warm": "CUPTI kernel time of one profiled call (no launch gaps)",
}


@dataclass(frozen=True)
class Timing:
    """What ``read`` found; ``method``/``l2`` are "unknown" when nothing could be read."""

    method: str  # "cupti", "cuda-graph", "events", "cutile_perf.bench <mode>", "mixed" or "unknown"
    l2: str  # "flushed", "not flushed", "mixed" or "unknown"
    summary: str  # one line, for init, status and session.yaml
    closest_bench_mode: str = ""
    sources: tuple[str, ...] = ()  # files read, repo-relative
    settings: dict[str, str] = field(default_factory=dict)  # flag -> its value and where it came from
    notes: tuple[str, ...] = ()  # per call site, and flags that have no effect
    # The timed calls' results are compared with a reference (bench.OutputCheck): a kernel that does
    # less work only when it is timed fails the perf test instead of being measured as faster.
    checked: bool = False

    def to_dict(self) -> dict:
        return {"method": self.method, "l2": self.l2, "summary": self.summary,
                "closest_bench_mode": self.closest_bench_mode, "sources": list(self.sources),
                "settings": dict(self.settings), "notes": list(self.notes), "checked": self.checked}


def unknown(why: str, sources: tuple[str, ...] = ()) -> Timing:
    return Timing("unknown", "unknown", f"not read: {why}", sources=sources)


# --- modules ---------------------------------------------------------------------------------------


@dataclass
class _Module:
    path: Path
    tree: ast.Module
    source: str

    @property
    def functions(self) -> dict[str, ast.FunctionDef]:
        return {n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef)}


def _parse(path: Path) -> _Module | None:
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
        return _Module(path, ast.parse(source, filename=str(path)), source)
    except (OSError, SyntaxError, ValueError):
        return None


def _module_file(base: Path, dotted: str) -> Path | None:
    """``base/a/b.py`` or ``base/a/b/__init__.py`` for ``a.b``; None when neither is a file."""
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        return base / "__init__.py" if (base / "__init__.py").is_file() else None
    return next((c for c in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py"))
                 if c.is_file()), None)


def _imported_files(module: _Module, root: Path) -> list[Path]:
    """The repository files ``module`` imports (relative imports, and absolute ones that resolve
    under the repository root, its ``src/`` or the module's own folder)."""
    found: list[Path] = []
    here = module.path.parent
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = base.parent
                bases = [base]
            else:
                bases = [root, root / "src", here]
            for base in bases:
                names = [node.module or ""] + [f"{node.module}.{a.name}" if node.module else a.name for a in node.names]
                found += [f for f in (_module_file(base, n) for n in names) if f is not None]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found += [f for base in (root, root / "src", here) if (f := _module_file(base, alias.name))]
    resolved_root = root.resolve()
    return [f for f in dict.fromkeys(p.resolve() for p in found)
            if f.is_relative_to(resolved_root) and f != module.path.resolve()]


def _uses_bench(module: _Module) -> bool:
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and node.module == "cutile_perf.bench":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "cutile_perf" and any(a.name == "bench" for a in node.names):
            return True
        if isinstance(node, ast.Import) and any(a.name == "cutile_perf.bench" for a in node.names):
            return True
    return False


def _checks_timed_calls(modules: list[_Module]) -> bool:
    """A perf test (or a helper it imports) that builds a ``bench.OutputCheck`` or passes ``check=`` to
    the timing call. Read, not proven: a check built and never used still counts."""
    for module in modules:
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Call):
                continue
            name = (_call_name(node) or "").split(".")[-1]
            if name == "OutputCheck" or (name in ("bench_record", "measure", "bench")
                                         and any(kw.arg == "check" for kw in node.keywords)):
                return True
    return False


# --- TileGym's dispatcher --------------------------------------------------------------------------


def _flag_kind(name: str) -> str | None:
    return next((kind for kind, pattern in _FLAG.items() if pattern.search(name)), None)


def _params_with_defaults(func: ast.FunctionDef) -> dict[str, ast.expr | None]:
    args = func.args
    positional = args.posonlyargs + args.args
    defaults: dict[str, ast.expr | None] = {a.arg: None for a in positional}
    for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
        defaults[arg.arg] = default
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        defaults[arg.arg] = default
    return defaults


def _dispatcher(modules: list[_Module]) -> tuple[_Module, ast.FunctionDef] | None:
    """The first function with a CUPTI or CUDA-graph flag parameter and an ``if <flag>:`` on it."""
    for module in modules:
        for func in module.functions.values():
            flags = [p for p in _params_with_defaults(func) if _flag_kind(p)]
            if flags and any(isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id in flags
                             for n in ast.walk(func)):
                return module, func
    return None


def _chain(func: ast.FunctionDef, functions: dict[str, ast.FunctionDef]) -> list[tuple[str | None, str]]:
    """``[(flag, timing function), ..., (None, else-function)]`` from the dispatcher's if/elif/else."""
    flags = {p for p in _params_with_defaults(func) if _flag_kind(p)}

    def target(body: list[ast.stmt]) -> str | None:
        for stmt in body:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Name) and node.id in functions and node.id != func.name:
                    return node.id
        return None

    for node in ast.walk(func):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id in flags:
            chain: list[tuple[str | None, str]] = []
            current: ast.If | None = node
            while current is not None:
                if (name := target(current.body)) is not None:
                    chain.append((current.test.id, name))
                rest = current.orelse
                if len(rest) == 1 and isinstance(rest[0], ast.If) and isinstance(rest[0].test, ast.Name) \
                        and rest[0].test.id in flags:
                    current = rest[0]
                    continue
                if rest and (name := target(rest)) is not None:
                    chain.append((None, name))
                current = None
            return chain
    return []


def classify_timer(func: ast.FunctionDef) -> tuple[str, str]:
    """(method, L2) of one timing function, from what its body calls (pure)."""
    # Calls by their own name: TileGym's event and graph timers also call a helper named
    # _extract_kernel_times_from_profile once, for a kernel list, outside their timing.
    called = {_call_name(n) for n in ast.walk(func) if isinstance(n, ast.Call)}
    if called & {"profile", "torch_profile"}:
        method = "cupti"
    elif called & {"CUDAGraph", "graph"}:
        method = "cuda-graph"
    elif "Event" in called:
        method = "events"
    else:
        return "unknown", "unknown"
    flushed = any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "zero_"
                  for loop in ast.walk(func) if isinstance(loop, (ast.For, ast.While))
                  for stmt in loop.body for call in ast.walk(stmt))
    return method, "flushed" if flushed else "not flushed"


def _env_bool(value: str) -> bool:
    """TileGym's FromEnvironment rule for a ``type=bool`` setting."""
    return value.strip().lower() not in ("0", "false", "no", "")


def _config_settings(modules: list[_Module], root: Path) -> dict[str, tuple[str | None, ast.expr | None, str]]:
    """{attribute: (envvar, default, repo-relative file)} for ``add_argument("--name", envvar=..., default=...)``."""
    found: dict[str, tuple[str | None, ast.expr | None, str]] = {}
    for module in modules:
        for node in ast.walk(module.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument" and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str) and node.args[0].value.startswith("--")):
                continue
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            envvar = keywords.get("envvar")
            dest = node.args[0].value.lstrip("-").replace("-", "_")
            found.setdefault(dest, (envvar.value if isinstance(envvar, ast.Constant) else None,
                                    keywords.get("default"), _rel(module.path, root)))
    return found


@dataclass(frozen=True)
class _Flag:
    value: bool | None  # None: not a literal (depends on the test's parameters)
    origin: str  # where the value comes from, for people
    name: str = ""  # how people set it: the environment variable, or the keyword at the call


def _default_flag(param: str, default: ast.expr | None, settings, env: dict[str, str]) -> _Flag:
    if isinstance(default, ast.Constant) and isinstance(default.value, bool):
        return _Flag(default.value, "the default", param)
    if isinstance(default, ast.Attribute) and default.attr in settings:
        envvar, config_default, where = settings[default.attr]
        if envvar and envvar in env:
            return _Flag(_env_bool(env[envvar]), f"env {envvar}={env[envvar]}", envvar)
        value = config_default.value if isinstance(config_default, ast.Constant) else None
        return _Flag(bool(value) if value is not None else None,
                     f"{where} default" + (f", {envvar} unset" if envvar else ""), envvar or param)
    return _Flag(None, f"default {ast.unparse(default) if default is not None else 'missing'}", param)


def _forwarders(dispatcher: str, modules: list[_Module]) -> set[str]:
    """Names of functions that call the dispatcher, directly or through each other (TileGym's
    ``benchmark_framework``), plus the dispatcher itself."""
    names = {dispatcher}
    for _ in range(_MAX_DEPTH):
        for module in modules:
            for func in module.functions.values():
                if func.name in names:
                    continue
                if any(isinstance(n, ast.Call) and _call_name(n) in names for n in ast.walk(func)):
                    names.add(func.name)
    return names


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _with_imports(test: _Module, root: Path) -> list[_Module]:
    """``test`` and the modules it imports from the repository, transitively up to ``_MAX_DEPTH``
    (the helpers the test imports, and the settings modules they import)."""
    modules, queue = [test], [test]
    for _ in range(_MAX_DEPTH):
        nxt = []
        for module in queue:
            for path in _imported_files(module, root):
                if all(m.path.resolve() != path for m in modules) and (parsed := _parse(path)) is not None:
                    modules.append(parsed)
                    nxt.append(parsed)
        queue = nxt
    return modules


def _bench_timing(env: dict[str, str], sources: tuple[str, ...], checked: bool) -> Timing:
    """A perf test timed by ``cutile_perf.bench``: its mode from ``CUTILE_PERF_BENCH_MODE`` (cold by default)."""
    mode = (env.get("CUTILE_PERF_BENCH_MODE") or "cold").strip().lower()
    l2 = BENCH_MODE_L2.get(mode, "unknown")
    origin = f"env CUTILE_PERF_BENCH_MODE={mode}" if "CUTILE_PERF_BENCH_MODE" in env else "the default"
    return Timing(f"cutile_perf.bench {mode}", l2,
                  f"cutile_perf.bench, mode {mode} ({origin}): {BENCH_MODE_METHOD.get(mode, 'unknown mode')}, "
                  f"L2 {l2} before each sample",
                  closest_bench_mode=mode, sources=sources, settings={"CUTILE_PERF_BENCH_MODE": f"{mode} ({origin})"},
                  checked=checked)


def read(root: Path, perf_test: str, env: dict[str, str]) -> Timing:
    """How ``perf_test`` (repo-relative) times its kernels under ``env`` (the variables that are set)."""
    root = Path(root)
    test = _parse(root / perf_test)
    if test is None:
        return unknown(f"cannot parse {perf_test}")
    modules = _with_imports(test, root)
    sources = (perf_test,)
    if bench_users := [m for m in modules if _uses_bench(m)]:
        sources = tuple(dict.fromkeys([perf_test, *(_rel(m.path, root) for m in bench_users)]))
        return _bench_timing(env, sources, _checks_timed_calls(modules))
    found = _dispatcher(modules)
    if found is None:
        return unknown(f"no cutile_perf.bench and no timing function with a use_cupti/use_cudagraph switch in "
                       f"{perf_test} or the modules it imports", sources)
    module, dispatcher = found
    functions = module.functions
    chain = _chain(dispatcher, functions)
    if not chain:
        return unknown(f"{_rel(module.path, root)}: {dispatcher.name}() picks no timing function by its flags", sources)
    settings = _config_settings(modules, root)
    params = _params_with_defaults(dispatcher)
    defaults = {p: _default_flag(p, d, settings, env) for p, d in params.items() if _flag_kind(p)}
    used = {settings[d.attr][2] for d in params.values() if isinstance(d, ast.Attribute) and d.attr in settings}
    sources = tuple(dict.fromkeys([perf_test, _rel(module.path, root), *sorted(used)]))
    timers = {name: classify_timer(functions[name]) for _, name in chain}
    branch = {flag: name for flag, name in chain}
    callers = _forwarders(dispatcher.name, modules)

    def chosen(values: dict[str, bool]) -> str | None:
        """The flag whose branch runs (None: the else branch)."""
        return next(flag for flag, _ in chain if flag is None or values.get(flag))

    notes: list[str] = []
    outcomes: dict[tuple[str, str], None] = {}
    calls = [n for n in ast.walk(test.tree) if isinstance(n, ast.Call) and _call_name(n) in callers]
    for call in calls or [None]:
        flags, by_call = dict(defaults), set()
        where = f"{perf_test}:{call.lineno}" if call is not None else "the defaults"
        for kw in (call.keywords if call is not None else []):
            if kw.arg in flags:
                literal = kw.value.value if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool) else None
                flags[kw.arg] = _Flag(literal, f"{kw.arg}={ast.unparse(kw.value)}", kw.arg)
                by_call.add(kw.arg)
        open_flags = [f for f, v in flags.items() if v.value is None]
        winners: list[str | None] = []
        for combo in itertools.product((True, False), repeat=len(open_flags)):
            values = {f: bool(v.value) for f, v in flags.items() if v.value is not None} | dict(zip(open_flags, combo))
            winner = chosen(values)
            winners.append(winner)
            outcomes[timers[branch[winner]]] = None
            for flag in by_call:  # a switch the test sets that an earlier branch overrides
                if values.get(flag) and flag != winner and winner is not None and flags[flag].value is not None:
                    notes.append(f"{where}: {flags[flag].origin} has no effect while {flags[winner].name} is on")
        picked = " or ".join(dict.fromkeys(branch[w] for w in winners))
        why = ", ".join(flags[f].origin for f in sorted(by_call)) or "the defaults"
        notes.append(f"{where}: {picked} ({why})")
    notes = list(dict.fromkeys(notes))
    order = [flag for flag, _ in chain if flag] + [flag for flag in defaults if flag not in branch]
    switches = {defaults[f].name: f"{'on' if defaults[f].value else 'off' if defaults[f].value is not None else '?'} "
                                  f"({defaults[f].origin})" for f in order}
    method = next(iter(outcomes))[0] if len({m for m, _ in outcomes}) == 1 else "mixed"
    l2 = next(iter(outcomes))[1] if len({l for _, l in outcomes}) == 1 else "mixed"
    summary = " or ".join(f"{METHODS.get(m, m)}, L2 {l} before each sample" for m, l in outcomes)
    summary += "; " + ", ".join(f"{name} {text}" for name, text in switches.items())
    closest = " or ".join(dict.fromkeys(CLOSEST_BENCH_MODE.get(o, "none") for o in outcomes))
    return Timing(method, l2, summary, closest, sources, switches, tuple(notes[:8]), _checks_timed_calls(modules))


def perf_test_file(test: str, perf_test_files: list[str]) -> str:
    """The file the perf command runs: a perf file of its own (``scaffold-perf``'s), else ``test``."""
    return perf_test_files[0] if perf_test_files else test
