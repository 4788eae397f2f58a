"""Find a cuTile kernel and its tests in a TileGym-shaped repository, and describe the kernel from its AST.

Pure functions over files: nothing here runs or imports the kernel. The classification is an
estimate from what the code calls (``ct.mma``, reductions, ``exp``) and the file name; it only
orders the playbook, it never decides anything.
"""
from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cutile_perf.kernel import probes
from cutile_perf.errors import UsageError

LAUNCH_NAMES = ("launch", "autotune_launch", "exhaustive_search")
_REDUCTIONS = {"sum", "max", "min", "prod", "reduce", "argmax", "argmin", "cumsum", "cumprod", "scan"}
_MMA = {"mma", "matmul", "mma_scaled"}
_EXP = {"exp", "exp2"}
_IGNORED_DIRS = {".git", "sandbox", "__pycache__", ".venv", "venv", "node_modules", "build", "dist"}

# Arithmetic intensity (FLOP per byte) typical of each kernel type; used only as an estimate.
_TYPE_AI = {"elementwise": 0.25, "reduction-norm": 2.0, "matmul": 150.0, "attention": 80.0}


def _norm(stem: str) -> str:
    return stem.lower().replace("_", "").replace("-", "")


def _walk(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.rglob(pattern) if not (_IGNORED_DIRS & set(p.relative_to(root).parts[:-1])))


def find_kernel_files(repo: Path, kernel: str) -> list[Path]:
    """The kernel file for a name (``rms_norm`` matches ``rms_norm.py`` and ``rmsnorm.py``) or a path.

    Names are searched under ``src/**/cutile/``; a name matching several files is ambiguous.
    """
    as_path = Path(kernel)
    candidate = as_path if as_path.is_absolute() else repo / as_path
    if kernel.endswith(".py") or "/" in kernel:
        if not candidate.is_file():
            raise UsageError(f"kernel file {kernel} does not exist", "pass a name like rms_norm or a path to a .py file")
        return [candidate.resolve()]
    src = repo / "src"
    if not src.is_dir():
        raise UsageError(f"{repo} has no src/ directory to search for kernel {kernel!r}", "pass the kernel file path")
    files = cutile_files(repo)
    exact = [p for p in files if p.stem == kernel]
    loose = [p for p in files if _norm(p.stem) == _norm(kernel)]
    found = exact or loose
    if not found:
        raise UsageError(f"no kernel named {kernel!r} under src/**/cutile/", "pass the kernel file path with --kernel")
    if len(found) > 1:
        listed = ", ".join(str(p.relative_to(repo)) for p in found)
        raise UsageError(f"kernel name {kernel!r} is ambiguous: {listed}",
                         f"pass one of these paths with --kernel, e.g. --kernel {found[0].relative_to(repo)}")
    return found


def cutile_files(repo: Path) -> list[Path]:
    """Every ``.py`` file under ``src/**/cutile/`` (at any depth below a ``cutile`` folder), sorted."""
    src = repo / "src"
    if not src.is_dir():
        return []
    return [p for p in _walk(src, "*.py") if "cutile" in p.relative_to(src).parts[:-1]]


def op_files(repo: Path) -> list[Path]:
    """The kernel files of a TileGym-shaped repo: files under ``src/**/cutile/`` that define a ``@ct.kernel``.

    Helpers (``utils.py``, ``__init__.py``) define none and are left out; a file that does not
    parse is kept, so the survey reports it instead of hiding it.
    """
    found = []
    for path in cutile_files(repo):
        try:
            if scan_file(path, repo).kernels:
                found.append(path)
        except UsageError:
            found.append(path)
    return found


def _folders_in_order(needles: tuple[str, ...], haystack: tuple[str, ...]) -> bool:
    """True when every folder of ``needles`` appears in ``haystack``, in the same order."""
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


def choose_test_file(repo: Path, kernel_file: Path) -> tuple[Path, list[Path]]:
    """The test file of a kernel file, and the other candidates it was chosen over.

    Candidates are ``tests/**/test_<stem>.py`` (loosely: ``test_rmsnorm.py`` for ``rms_norm.py``).
    When there are several, the rule is: keep those whose folders under ``tests/`` all appear, in
    order, in the kernel's path, and take the one with the most such folders. So in TileGym
    ``src/tilegym/ops/cutile/rms_norm.py`` pairs with ``tests/ops/test_rms_norm.py`` and
    ``src/tilegym/suites/liger/cutile/rms_norm.py`` with ``tests/suites/liger/test_rms_norm.py``.
    No candidate, or a tie, is a UsageError naming the candidates and ``--test``.
    """
    tests = repo / "tests"
    stem = kernel_file.stem
    files = _walk(tests, "test_*.py") if tests.is_dir() else []
    exact = [p for p in files if p.stem == f"test_{stem}"]
    found = exact or [p for p in files if _norm(p.stem) == _norm(f"test_{stem}")]
    if not found:
        raise UsageError(f"no tests/**/test_{stem}.py found", "pass the test file with --test")
    if len(found) == 1:
        return found[0], []
    kernel_dirs = kernel_file.resolve().relative_to(repo.resolve()).parts[:-1]
    scored = [(len(p.relative_to(tests).parts) - 1, p) for p in found
              if _folders_in_order(p.relative_to(tests).parts[:-1], kernel_dirs)]
    best = max((score for score, _ in scored), default=None)
    winners = [p for score, p in scored if score == best]
    if len(winners) != 1:
        listed = ", ".join(str(p.relative_to(repo)) for p in found)
        raise UsageError(f"several test files for {kernel_file.name}: {listed}", "pass one with --test")
    return winners[0], [p for p in found if p != winners[0]]


def sibling_perf_test(test_file: Path) -> Path | None:
    """``test_<op>_perf.py`` next to ``test_<op>.py`` (what ``scaffold-perf`` writes), when it exists."""
    candidate = test_file.with_name(f"{test_file.stem}_perf.py")
    return candidate if candidate.is_file() else None


@dataclass(frozen=True)
class KernelScan:
    path: str
    kernels: list[dict] = field(default_factory=list)  # {"name", "line", "hints"}
    launches: list[dict] = field(default_factory=list)  # {"call", "line", "function"}
    registrations: list[dict] = field(default_factory=list)  # {"op", "backend", "function", "line"}
    autotune_configs: list[dict] = field(default_factory=list)  # {"line", "values"}
    ops: dict[str, int] = field(default_factory=dict)  # counts of ct.<name> calls
    persistent: bool = False  # a loop strides by ct.num_blocks
    kernel_type: str = "elementwise"
    ai_estimate: float = 0.0
    bound: str = "memory-bound"

    def to_dict(self) -> dict:
        return asdict(self)


def _call_name(node: ast.AST) -> str | None:
    """``ct.load`` -> "load"; ``exhaustive_search`` -> "exhaustive_search"."""
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ast.unparse(node)


def _kernel_hints(decorator: ast.AST) -> dict | None:
    """Hints of a ``@ct.kernel`` / ``@ct.kernel(...)`` decorator, or None for another decorator."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if _call_name(target) != "kernel":
        return None
    if isinstance(decorator, ast.Call):
        return {kw.arg: _literal(kw.value) for kw in decorator.keywords if kw.arg}
    return {}


def _registration(decorator: ast.AST) -> dict | None:
    if not isinstance(decorator, ast.Call) or _call_name(decorator) != "register_impl":
        return None
    op = _literal(decorator.args[0]) if decorator.args else None
    kwargs = {kw.arg: _literal(kw.value) for kw in decorator.keywords if kw.arg}
    backend = kwargs.get("backend", _literal(decorator.args[1]) if len(decorator.args) > 1 else None)
    return {"op": op, "backend": backend}


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.kernels: list[dict] = []
        self.launches: list[dict] = []
        self.registrations: list[dict] = []
        self.configs: list[dict] = []
        self.ops: dict[str, int] = {}
        self.persistent = False
        self.matmul_operator = False
        self._function: list[str] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for decorator in node.decorator_list:
            hints = _kernel_hints(decorator)
            if hints is not None:
                self.kernels.append({"name": node.name, "line": node.lineno, "hints": hints})
            reg = _registration(decorator)
            if reg is not None:
                self.registrations.append({**reg, "function": node.name, "line": node.lineno})
        self._function.append(node.name)
        self.generic_visit(node)
        self._function.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node)
        if name in LAUNCH_NAMES:
            self.launches.append({"call": name, "line": node.lineno,
                                  "function": self._function[-1] if self._function else None})
        if name == "SimpleNamespace" and node.keywords:
            self.configs.append({"line": node.lineno, "values": {kw.arg: _literal(kw.value) for kw in node.keywords}})
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            self.ops[name] = self.ops.get(name, 0) + 1
        for kw in node.keywords:
            if kw.arg in {"allow_tma", "latency", "flush_to_zero", "rounding_mode"}:
                self.ops[f"{kw.arg}="] = self.ops.get(f"{kw.arg}=", 0) + 1
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        if isinstance(node.iter, ast.Call) and any(
            isinstance(sub, ast.Call) and _call_name(sub) == "num_blocks" for sub in ast.walk(node.iter)
        ):
            self.persistent = True
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.matmul_operator = True
        self.generic_visit(node)


def classify(stem: str, ops: dict[str, int], matmul_operator: bool) -> str:
    """elementwise / reduction-norm / matmul / attention, from the calls made and the file name."""
    name = stem.lower()
    has_mma = matmul_operator or any(ops.get(op) for op in _MMA)
    if any(word in name for word in ("attention", "attn", "fmha", "mla", "flash")) or (
        has_mma and any(ops.get(op) for op in _EXP)
    ):
        return "attention"
    if has_mma or any(word in name for word in ("matmul", "gemm", "bmm", "linear")):
        return "matmul"
    if any(ops.get(op) for op in _REDUCTIONS) or any(w in name for w in ("norm", "softmax", "reduce", "loss")):
        return "reduction-norm"
    return "elementwise"


def bound_of(ai: float) -> str:
    """The skill's bands: AI < 10 memory-bound, 10..50 balanced, > 50 compute-bound."""
    if ai < 10:
        return "memory-bound"
    if ai <= 50:
        return "balanced"
    return "compute-bound"


def scan_source(source: str, path: str = "<kernel>") -> KernelScan:
    """Describe one kernel file; a syntax error is a usage error (the file cannot be the baseline)."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise UsageError(f"{path}:{exc.lineno}: cannot parse the kernel file ({exc.msg})") from None
    visitor = _Visitor()
    visitor.visit(tree)
    kernel_type = classify(Path(path).stem, visitor.ops, visitor.matmul_operator)
    ai = _TYPE_AI[kernel_type]
    return KernelScan(path=path, kernels=visitor.kernels, launches=visitor.launches,
                      registrations=visitor.registrations, autotune_configs=visitor.configs, ops=visitor.ops,
                      persistent=visitor.persistent, kernel_type=kernel_type, ai_estimate=ai, bound=bound_of(ai))


def scan_file(path: Path, repo: Path | None = None) -> KernelScan:
    shown = str(path.relative_to(repo)) if repo and path.is_relative_to(repo) else str(path)
    why = probes.too_large(shown, path.stat().st_size)
    if why:
        raise UsageError(why, "point --kernel at the kernel module itself")
    return scan_source(path.read_text(encoding="utf-8"), shown)


def render(scan: KernelScan) -> str:
    """A few lines for people: what was found and the estimate."""
    kernels = ", ".join(f"{k['name']} (line {k['line']}{', ' + str(k['hints']) if k['hints'] else ''})"
                        for k in scan.kernels) or "none found"
    launches = ", ".join(f"{x['call']} in {x['function']} (line {x['line']})" for x in scan.launches) or "none found"
    regs = ", ".join(f"{r['op']}[{r['backend']}] -> {r['function']}" for r in scan.registrations) or "none"
    lines = [
        f"kernel file: {scan.path}",
        f"@ct.kernel: {kernels}",
        f"launch sites: {launches}",
        f"@register_impl: {regs}",
        f"autotune configs: {len(scan.autotune_configs)} found" + (
            f" (first: {scan.autotune_configs[0]['values']})" if scan.autotune_configs else ""),
        f"type: {scan.kernel_type}; arithmetic intensity estimate ~{scan.ai_estimate:g} FLOP/byte "
        f"(an estimate from the kernel type, not a measurement) -> {scan.bound}",
    ]
    return "\n".join(lines)
