"""Static scan of a candidate's change for measurement-context probes and monkeypatching.

"Perf-only behaviour" is a kernel that does less work only when it is benchmarked: it asks where it
runs (pytest's current test, the harness's environment, the argv, the call stack, ``/proc/self``,
the checkout's path) or patches the clocks and statistics that time it. Both are refused before
anything runs, from the source alone: ``scan`` parses the fenced files' old and new text with
``ast`` and reports what the NEW text adds. A finding is keyed by its rule and its normalised code
(``ast.unparse`` of the node), counted across all fenced files, so code that only moved (within a
file or between fenced files) or was re-indented is not new.

Rules (``Finding.rule``):

* ``env``: a read of ``PYTEST_CURRENT_TEST``, ``PYTEST_*``, ``CUTILE_PERF_*`` or
  ``CUDA_TILE_CACHE_DIR`` (``os.environ[...]``, ``.get``, ``in``, ``os.getenv``, ``from os import
  environ``/``getenv``), with the key a literal, a folded ``"A" + "B"``, or a module constant; and
  any other (non-docstring) string naming one of them, e.g. a prefix matched while iterating the
  environment.
* ``argv``: ``sys.argv``, ``sys.orig_argv``.
* ``stack``: ``inspect.stack``/``currentframe``/``getouterframes``/``trace``, ``sys._getframe``,
  ``sys._current_frames``, ``traceback.extract_stack``/``walk_stack``/``format_stack``/
  ``print_stack``, and frame attributes (``f_back``, ``f_globals``, ``f_locals``).
* ``sys-modules``: ``sys.modules`` looked up for ``pytest``, ``_pytest``, ``cutile_perf``,
  ``xdist``, ``pluggy`` (subscript, ``.get``, ``in``).
* ``proc``: ``/proc/self``, ``/proc/thread-self``, ``/proc/<pid>``, a bare ``/proc``, an f-string
  starting ``/proc/{...}``, ``os.readlink`` of a ``/proc`` or ``/dev/fd`` path. (``/proc/cpuinfo``
  and ``/proc/meminfo`` are hardware, not context, and pass.)
* ``cwd-path``: ``os.getcwd()``, ``Path.cwd()``, ``__file__`` or ``sys.path`` compared with (or
  searched for) a string naming the harness's places: ``checkout``, ``cutile-perf``,
  ``cutile_perf``, ``sandbox``, ``pristine``.
* ``import``: importing ``pytest``, ``_pytest``, ``pluggy``, ``xdist`` or ``cutile_perf`` (import
  statements, ``importlib.import_module``, ``__import__``) in a fenced file. ``cutile_perf.tune``
  is allowed: it is the autotuner the bundled kernels launch through.
* ``monkeypatch``: assigning, deleting or ``setattr``-ing an attribute of ``time``, ``statistics``,
  ``torch.cuda``, ``torch.profiler``, ``triton``, ``pytest``, ``_pytest``, ``cutile_perf``,
  ``builtins``, ``os``, ``sys`` or anything inside them (``torch.cuda.Event.elapsed_time = ...``),
  through any import alias (``import time as t``, ``from torch import cuda``), a plain alias
  (``clock = time``), ``sys.modules["time"]`` or ``importlib.import_module("time")``; writing
  into ``__builtins__`` or a watched object's ``__dict__``/``vars()``; ``mock.patch("time....")``
  and ``patch.object(time, ...)``.

What a static scan cannot see: names built at run time (``getattr(__import__("ti" + "me"), ...)``
with computed strings, ``exec``/``eval`` of data, ``marshal``/``pickle`` payloads), code in a file
outside the fence or in a C extension, and probes that need no special name (timing its own calls
to tell a warm benchmark loop from a single correctness call). Those stay the job of the run-time
checks (the child's timer identity check, the interleaved re-measurement, ``verify``).
"""
from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass

_ENV_EXACT = {"PYTEST_CURRENT_TEST", "CUDA_TILE_CACHE_DIR"}
_ENV_PREFIXES = ("PYTEST_", "CUTILE_PERF_")
_FRAMEWORK = ("pytest", "_pytest", "cutile_perf", "xdist", "pluggy")
_ALLOWED_IMPORTS = ("cutile_perf.tune",)
_PATCHED = ("time", "statistics", "torch.cuda", "torch.profiler", "triton", "triton.testing", "pytest", "_pytest",
            "cutile_perf", "builtins", "os", "sys")
_STACK_CALLS = {"inspect.stack", "inspect.currentframe", "inspect.getouterframes", "inspect.trace",
                "sys._getframe", "sys._current_frames", "traceback.extract_stack", "traceback.walk_stack",
                "traceback.format_stack", "traceback.print_stack"}
_FRAME_ATTRS = {"f_back", "f_globals", "f_locals"}
_PLACE_MARKERS = ("checkout", "cutile-perf", "cutile_perf", "sandbox", "pristine")
_SEARCH_METHODS = {"startswith", "endswith", "find", "rfind", "index", "rindex", "count", "split", "partition",
                   "rpartition", "__contains__"}
_PROC = re.compile(r"^/proc/?$|/proc/(self|thread-self|\d+)(/|$)")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    text: str  # the one-line reason, with the code that triggered it

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.text}"


def _env_name(value: object) -> bool:
    return isinstance(value, str) and (value in _ENV_EXACT or value.startswith(_ENV_PREFIXES))


def _framework(module: str) -> bool:
    if any(module == a or module.startswith(a + ".") for a in _ALLOWED_IMPORTS):
        return False
    return module.split(".")[0] in _FRAMEWORK


def _under(name: str | None, roots) -> bool:
    return name is not None and any(name == r or name.startswith(r + ".") for r in roots)


def _short(node: ast.AST, limit: int = 100) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Scanner(ast.NodeVisitor):
    def __init__(self, tree: ast.Module):
        self.found: list[tuple[int, str, str, str]] = []  # (line, rule, reason, key)
        self.flagged: set[int] = set()  # ids of nodes already reported (no double report of a key)
        self.aliases: dict[str, str] = {"__builtins__": "builtins"}
        self.constants: dict[str, str] = {}
        self.docstrings: set[int] = set()
        self._collect(tree)

    # --- what names mean -----------------------------------------------------------------------

    def _collect(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    self.docstrings.add(id(body[0].value))
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    if a.name != "*":
                        self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        # Plain aliases (``clock = time``) and string constants (``KEY = "PYTEST_CURRENT_TEST"``),
        # to a fixed point so that chains resolve.
        for _ in range(3):
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    name = node.targets[0].id
                    text = self._string(node.value)
                    if text is not None:
                        self.constants[name] = text
                        continue
                    target = self.resolve(node.value)
                    if target is not None and name not in self.aliases:
                        self.aliases[name] = target

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression stands for (through aliases), or None."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Subscript) and self.resolve(node.value) == "sys.modules":
            return self._string(node.slice)
        if isinstance(node, ast.Call) and node.args:
            func = self.resolve(node.func) or (node.func.id if isinstance(node.func, ast.Name) else None)
            if func in ("importlib.import_module", "__import__", "builtins.__import__"):
                return self._string(node.args[0])
        return None

    def _string(self, node: ast.AST | None) -> str | None:
        """A string expression's value when it is knowable without running anything."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self._string(node.left), self._string(node.right)
            return left + right if left is not None and right is not None else None
        if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
            return "".join(str(v.value) for v in node.values)
        return None

    def flag(self, node: ast.AST, rule: str, reason: str, *, mark: ast.AST | None = None) -> None:
        for n in ast.walk(mark or node):
            self.flagged.add(id(n))
        code = _short(node)
        self.found.append((getattr(node, "lineno", 0), rule, f"{reason}: {code}", f"{rule}\0{ast.unparse(node)}"))

    # --- rules ---------------------------------------------------------------------------------

    def _env_call_key(self, node: ast.Call) -> ast.AST | None:
        func = self.resolve(node.func)
        if func in ("os.getenv", "os.environ.get", "os.environ.pop", "os.environ.setdefault",
                    "os.environ.__getitem__", "os.getenvb", "os.environb.get") and node.args:
            return node.args[0]
        return None

    def visit_Call(self, node: ast.Call) -> None:
        func = self.resolve(node.func)
        key = self._env_call_key(node)
        if key is not None and _env_name(self._string(key)):
            self.flag(node, "env", f"reads ${self._string(key)}")
        elif func in _STACK_CALLS:
            self.flag(node, "stack", f"calls {func}")
        elif func in ("sys.modules.get", "sys.modules.pop") and node.args and \
                _framework(self._string(node.args[0]) or ""):
            self.flag(node, "sys-modules", f"looks up {self._string(node.args[0])} in sys.modules")
        elif func == "os.readlink" and node.args and re.search(r"/proc|/dev/fd", _short(node.args[0], 400)):
            self.flag(node, "proc", "reads a /proc or /dev/fd link")
        elif func in ("importlib.import_module", "__import__", "builtins.__import__") and node.args \
                and _framework(self._string(node.args[0]) or ""):
            self.flag(node, "import", f"imports {self._string(node.args[0])}")
        elif func in ("builtins.setattr", "builtins.delattr", "type.__setattr__", "object.__setattr__") or (
                isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
                and node.func.id not in self.aliases):
            if node.args and _under(self.resolve(node.args[0]), _PATCHED):
                self.flag(node, "monkeypatch", f"{ast.unparse(node.func)} on {self.resolve(node.args[0])}")
        elif node.args and re.search(r"(^|\.)patch(\.object)?$", func or ast.unparse(node.func)):
            self._mock_patch(node, func or ast.unparse(node.func))
        elif isinstance(node.func, ast.Attribute) and node.func.attr in _SEARCH_METHODS:
            self._place_compare(node)
        self.generic_visit(node)

    def _mock_patch(self, node: ast.Call, callee: str) -> None:
        first = node.args[0]
        target = self._string(first) if not callee.endswith(".object") else self.resolve(first)
        if target and _under(target if callee.endswith(".object") else target.rsplit(".", 1)[0], _PATCHED):
            self.flag(node, "monkeypatch", f"mock-patches {target}")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        base = self.resolve(node.value)
        key = self._string(node.slice)
        if base in ("os.environ", "os.environb") and _env_name(key):
            self.flag(node, "env", f"reads ${key}")
        elif base == "sys.modules" and _framework(key or ""):
            self.flag(node, "sys-modules", f"looks up {key} in sys.modules")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)):
                base = self.resolve(right)
                key = self._string(node.left)
                if base in ("os.environ", "os.environb") and _env_name(key):
                    self.flag(node, "env", f"tests for ${key}")
                elif base == "sys.modules" and _framework(key or ""):
                    self.flag(node, "sys-modules", f"tests for {key} in sys.modules")
        if id(node) not in self.flagged:
            self._place_compare(node)
        self.generic_visit(node)

    def _place_compare(self, node: ast.AST) -> None:
        """``os.getcwd()``/``__file__``/``sys.path`` compared with, or searched for, a harness place name."""
        where = False
        marker = None
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id == "__file__":
                where = True
            elif isinstance(n, (ast.Call, ast.Attribute)):
                name = self.resolve(n.func if isinstance(n, ast.Call) else n) or ""
                if name in ("os.getcwd", "os.getcwdb", "sys.path", "sys.argv") or name.endswith(".cwd") or \
                        (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "cwd"):
                    where = True
            text = self._string(n) if isinstance(n, (ast.Constant, ast.Name, ast.BinOp)) else None
            if text and any(m in text.lower() for m in _PLACE_MARKERS):
                marker = text
        if where and marker is not None:
            self.flag(node, "cwd-path", f"compares its location with {marker!r}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.resolve(node)
        if name in ("sys.argv", "sys.orig_argv") and id(node) not in self.flagged:
            self.flag(node, "argv", f"reads {name}")
        elif node.attr in _FRAME_ATTRS and id(node) not in self.flagged:
            self.flag(node, "stack", f"reads a frame's {node.attr}")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if self.aliases.get(node.id) in ("sys.argv", "sys.orig_argv") and isinstance(node.ctx, ast.Load) \
                and id(node) not in self.flagged:
            self.flag(node, "argv", f"reads {self.aliases[node.id]}")

    def visit_Constant(self, node: ast.Constant) -> None:
        if id(node) in self.flagged or id(node) in self.docstrings or not isinstance(node.value, str):
            return
        if _env_name(node.value):
            self.flag(node, "env", "names a test or harness environment variable")
        elif _PROC.search(node.value):
            self.flag(node, "proc", "names a /proc entry of a process")

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        head = node.values[0] if node.values else None
        if isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith("/proc/") \
                and len(node.values) > 1 and not _PROC.search(head.value):
            self.flag(node, "proc", "builds a /proc path of a process")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if _framework(a.name):
                self.flag(node, "import", f"imports {a.name}")
                break

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0:
            names = [node.module] if node.module != "cutile_perf" else [f"cutile_perf.{a.name}" for a in node.names]
            bad = [n for n in names if _framework(n)]
            if bad:
                self.flag(node, "import", f"imports {bad[0]}")

    def _patched_target(self, target: ast.AST) -> str | None:
        if isinstance(target, ast.Attribute):
            base = self.resolve(target.value)
            if _under(base, _PATCHED):
                return f"{base}.{target.attr}"
        elif isinstance(target, ast.Subscript):
            inner = target.value
            if isinstance(inner, ast.Attribute) and inner.attr == "__dict__":
                base = self.resolve(inner.value)
            elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "vars" \
                    and inner.args:
                base = self.resolve(inner.args[0])
            elif isinstance(inner, ast.Name) and inner.id == "__builtins__":
                base = "builtins"
            else:
                return None
            if _under(base, _PATCHED):
                return f"{base}[{_short(target.slice, 40)}]"
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                found = self._patched_target(elt)
                if found:
                    return found
        return None

    def _assignment(self, node: ast.AST, targets) -> None:
        for target in targets:
            name = self._patched_target(target)
            if name:
                self.flag(node, "monkeypatch", f"replaces {name}", mark=target)
                break
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assignment(node, node.targets)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._assignment(node, [node.target])

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assignment(node, [node.target])

    def visit_Delete(self, node: ast.Delete) -> None:
        self._assignment(node, node.targets)


# The largest fenced Python file the scan reads. Parsing costs about 170 bytes of memory per byte of
# source (a 10 MB file took the harness to 1.7 GB); real kernel files are tens of KB.
MAX_SOURCE_BYTES = 1 << 20


def too_large(path: str, size: int) -> str | None:
    """Why the file ``path`` of ``size`` bytes is not scanned (one line), or None."""
    if size <= MAX_SOURCE_BYTES:
        return None
    return (f"{path} is {size / (1 << 20):.1f} MB, over the {MAX_SOURCE_BYTES >> 20} MB a fenced source file may "
            "hold (the static scan parses it whole)")



def _scan(text: str) -> list[tuple[int, str, str, str]]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    scanner = _Scanner(tree)
    scanner.visit(tree)
    return sorted(scanner.found)


def scan(old: dict[str, str | None], new: dict[str, str]) -> list[Finding]:
    """What the new text of the fenced Python files adds: findings not already in the old text.

    Compared by rule and normalised code over all the files, so moved or re-indented code is not
    reported; a second copy of an old probe is."""
    before: Counter[str] = Counter()
    for path, text in old.items():
        if text is not None and path.endswith(".py"):
            before.update(key for *_rest, key in _scan(text))
    out: list[Finding] = []
    for path in sorted(new):
        if not path.endswith(".py"):
            continue
        for line, rule, reason, key in _scan(new[path]):
            if before[key] > 0:
                before[key] -= 1
                continue
            out.append(Finding(path, line, rule, reason))
    return out


def describe(findings: list[Finding], limit: int = 3) -> str:
    """One line: the first findings with file:line and reason, and how many more."""
    if not findings:
        return "no measurement-context probe or monkeypatch found"
    shown = "; ".join(f"{f.path}:{f.line} [{f.rule}] {f.text}" for f in findings[:limit])
    more = f" (+{len(findings) - limit} more)" if len(findings) > limit else ""
    return f"perf-only behaviour suspected: {shown}{more}"
