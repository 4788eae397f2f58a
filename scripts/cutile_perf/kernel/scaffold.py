"""Plan a TileGym-style perf test from an op's correctness test, read with ``ast`` (never executed).

TileGym's correctness tests look alike: a ``test_op`` (often a method of a ``PyTestCase`` class)
parametrized over shapes and modes, which builds inputs and calls
``self.assertCorrectness(<op>, <reference>, <kwargs>, extra_test_kwargs=<extra>, ...)``. A perf
test needs the same shapes, the same inputs and the same op call, timed instead of compared.
``plan_perf_test`` extracts exactly those pieces as source text:

* parametrize decorators: shape-like ones (ints, dtypes, comprehensions) are copied whole; mode-like
  ones (only bools/strings) are pinned to their first case, so the perf selection stays small;
  the backend parameter becomes ``["cutile"]``;
* the statements that build the op's inputs (the dependency closure of the names the call uses);
* the ``set_backend``/``is_backend_available`` calls that select the backend;
* the module's imports and the module-level assignments the copied code needs.

What cannot be resolved this way (a name defined in the test class, a call that is not
``assertCorrectness``) is a ``UsageError`` naming it: the user then writes the perf test by hand.
``render`` fills ``templates/scaffold/perf_test.py.j2``.

A checked perf test (``--checked``, issue 19 item 5b) also needs the reference and the tolerance:
``ref_fn`` is called as the source test module's own object (``_source.Test_X().reference`` for a
method of the test class, ``_source.name`` for a module-level function), so nothing of it is copied;
``rtol``/``atol`` come from the ``assertCorrectness`` call, else the generated test uses the dtype
defaults of ``torch.testing.assert_close``.
"""
from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field
from pathlib import Path

from cutile_perf.errors import UsageError
from cutile_perf.templating import load_template

BACKEND_PARAMS = ("backend", "framework")
CHECK_CALL = "assertCorrectness"
TEMPLATE = "scaffold/perf_test.py.j2"
_BUILTINS = set(dir(builtins))


@dataclass(frozen=True)
class Parametrize:
    argnames: str  # "m,n,dtype"
    source: str  # the decorator as it will be written
    pinned: bool  # only the first case is kept


@dataclass(frozen=True)
class PerfPlan:
    source_test: str  # "tests/ops/test_softmax.py::Test_Softmax::test_op"
    op: str  # the op expression, e.g. "tilegym.ops.softmax"
    imports: list[str]
    module_statements: list[str]
    parametrize: list[Parametrize]
    backend_param: str
    params: list[str]  # the generated test's arguments, in order
    backend_setup: list[str]  # statements selecting the backend
    setup: list[str]  # statements building the inputs
    kwargs: str
    extra_kwargs: str
    no_grad: bool  # torch is imported: time the forward pass without autograd
    notes: list[str] = field(default_factory=list)
    # For a checked perf test: the reference as the generated file calls it (None when it cannot be
    # reached from there), its extra kwargs, the tolerance keywords, and the source module's name.
    reference: str | None = None
    extra_ref_kwargs: str = "{}"
    tolerance: str = ""
    source_module: str = ""

    def to_dict(self) -> dict:
        return {"source_test": self.source_test, "op": self.op, "params": self.params,
                "parametrize": [p.argnames + (" (first case only)" if p.pinned else "") for p in self.parametrize],
                "notes": self.notes}


# --- small AST helpers -----------------------------------------------------------------------------


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _assigned(stmt: ast.stmt) -> set[str]:
    targets: list[ast.AST] = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _call_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id
    return None


def _is_parametrize(dec: ast.AST) -> bool:
    return isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "parametrize"


def _argnames(dec: ast.Call) -> list[str]:
    node = dec.args[0] if dec.args else next((k.value for k in dec.keywords if k.arg == "argnames"), None)
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        raise UsageError(f"line {dec.lineno}: parametrize argnames are not a literal") from None
    names = value.split(",") if isinstance(value, str) else list(value)
    return [n.strip() for n in names if n.strip()]


def _argvalues(dec: ast.Call) -> ast.AST | None:
    if len(dec.args) > 1:
        return dec.args[1]
    return next((k.value for k in dec.keywords if k.arg == "argvalues"), None)


def is_mode_like(values: ast.AST) -> bool:
    """True when every leaf is a bool, str or None: modes and flags, not shapes or dtypes.

    Ints, ``torch.float16``-style attributes, names and comprehensions all count as shape-like.
    """
    if not isinstance(values, (ast.List, ast.Tuple)):
        return False
    for node in ast.walk(values):
        if isinstance(node, ast.Constant) and not (node.value is None or isinstance(node.value, (bool, str))):
            return False
        if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.ListComp, ast.BinOp, ast.UnaryOp)):
            return False
    return True


def _decorator_source(dec: ast.Call, values: ast.AST | None = None) -> str:
    """``@pytest.mark.parametrize(...)`` with one case per line when the cases are a literal list."""
    values = values if values is not None else _argvalues(dec)
    if not isinstance(values, (ast.List, ast.Tuple)) or len(values.elts) < 2:
        return "@" + ast.unparse(dec)
    head = [ast.unparse(a) for a in dec.args[:1]]
    cases = "\n".join(f"        {ast.unparse(e)}," for e in values.elts)
    rest = [f"{kw.arg}={ast.unparse(kw.value)}" for kw in dec.keywords if kw.arg != "argvalues"]
    inner = "\n".join(f"    {part}," for part in [*head, f"[\n{cases}\n    ]", *rest])
    return f"@{ast.unparse(dec.func)}(\n{inner}\n)"


def _pinned_source(dec: ast.Call, values: ast.List | ast.Tuple) -> str:
    """The decorator with only its first case (and first id, when the ids are a literal list)."""
    first = values.elts[:1]
    keywords = []
    for kw in dec.keywords:
        if kw.arg == "ids" and isinstance(kw.value, (ast.List, ast.Tuple)):
            keywords.append(ast.keyword("ids", ast.List(kw.value.elts[:1], ast.Load())))
        elif kw.arg != "argvalues":
            keywords.append(kw)
    args = [dec.args[0], ast.List(first, ast.Load())]
    return "@" + ast.unparse(ast.Call(dec.func, args, keywords))


# --- the plan ------------------------------------------------------------------------------------


def _find_test(tree: ast.Module) -> tuple[list[str], ast.FunctionDef, ast.Call]:
    """(qualified name parts, function, assertCorrectness call) of the first correctness test."""
    candidates: list[tuple[list[str], ast.FunctionDef]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            candidates.append(([node.name], node))
        elif isinstance(node, ast.ClassDef):
            candidates += [([node.name, f.name], f) for f in node.body if isinstance(f, ast.FunctionDef)]
    tests = [(q, f) for q, f in candidates if f.name.startswith("test_") and "perf" not in f.name]
    tests.sort(key=lambda item: item[1].name != "test_op")  # TileGym's name first, then file order
    for qual, func in tests:
        call = next((n for n in ast.walk(func) if _call_attr(n) == CHECK_CALL), None)
        if call is not None:
            return qual, func, call
    names = ", ".join(f.name for _, f in tests) or "none"
    raise UsageError(f"no correctness test calling {CHECK_CALL}(...) found (tests: {names})",
                     "write the perf test by hand; see an existing test_perf in the repository for the format")


def _statements_before(body: list[ast.stmt], call: ast.Call) -> list[ast.stmt]:
    """The statements that run before ``call``, flattening the ``with``/``if`` blocks that contain it."""
    out: list[ast.stmt] = []
    for stmt in body:
        if any(n is call for n in ast.walk(stmt)):
            if isinstance(stmt, (ast.With, ast.If)):
                out += _statements_before(stmt.body, call)
            return out
        out.append(stmt)
    return out


def _module_bindings(tree: ast.Module) -> tuple[list[str], dict[str, ast.stmt], set[str]]:
    """(import lines, name -> module-level assignment, every module-level name)."""
    imports, assigns, names = [], {}, set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            imports.append(ast.unparse(stmt))
            names |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for name in _assigned(stmt):
                assigns[name] = stmt
            names |= _assigned(stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            names.add(stmt.name)
    return imports, assigns, names


def _reference_call(ref_node: ast.AST | None, qual: list[str], module_names: set[str],
                    defined: set[str]) -> str | None:
    """How the generated test reaches ``ref_fn``: through ``_source`` (the correctness test's module)
    for what that module defines, as written for a library attribute; None when it cannot."""
    if ref_node is None:
        return None
    if isinstance(ref_node, ast.Attribute) and isinstance(ref_node.value, ast.Name) and ref_node.value.id == "self":
        return f"_source.{qual[0]}().{ref_node.attr}" if len(qual) == 2 else None
    if isinstance(ref_node, ast.Name):
        return f"_source.{ref_node.id}" if ref_node.id in defined else None
    if isinstance(ref_node, ast.Attribute) and not (_names_used(ref_node) - module_names):
        root = ref_node
        while isinstance(root, ast.Attribute):
            root = root.value
        return ast.unparse(ref_node) if isinstance(root, ast.Name) and root.id not in defined else f"_source.{ast.unparse(ref_node)}"
    return None  # a lambda or a call: its free names live in the test's own scope


def _plan_parametrize(func: ast.FunctionDef, module_names: set[str], test_rel: str,
                      notes: list[str]) -> tuple[list[Parametrize], str]:
    """(the perf test's parametrize decorators in source order, the backend parameter's name): the
    backend one is replaced, shape-like ones kept, mode-like ones pinned to their first case (said in
    ``notes``)."""
    parametrize: list[Parametrize] = []
    backend_param = "backend"
    for dec in reversed(func.decorator_list):  # bottom-up, as pytest applies them
        if not _is_parametrize(dec):
            continue
        names = _argnames(dec)
        values = _argvalues(dec)
        if len(names) == 1 and names[0] in BACKEND_PARAMS:
            backend_param = names[0]
            continue
        if values is None:
            raise UsageError(f"{test_rel}:{dec.lineno}: parametrize without values")
        free = _names_used(dec) - module_names - _BUILTINS
        if free:
            raise UsageError(f"{test_rel}:{dec.lineno}: the parametrize of {','.join(names)} uses "
                             f"{', '.join(sorted(free))}, defined inside the test class", "write the perf test by hand")
        pinned = is_mode_like(values) and len(getattr(values, "elts", [])) > 1
        text = _pinned_source(dec, values) if pinned else _decorator_source(dec, values)
        if pinned:
            notes.append(f"{','.join(names)}: only the first case of {test_rel} is timed; add cases to time more")
        parametrize.append(Parametrize(",".join(names), text, pinned))
    return parametrize[::-1], backend_param


def _needed_statements(before: list[ast.stmt], needed: set[str]) -> list[ast.stmt]:
    """The plain statements of ``before`` that build ``needed`` (closure over assigned names, in
    order); ``needed`` grows by what they use. Blocks (if/for/with/try) are never copied."""
    setup: list[ast.stmt] = []
    for stmt in reversed(before):
        if _assigned(stmt) & needed and not isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            setup.append(stmt)
            needed |= _names_used(stmt)
    return setup[::-1]


def _backend_setup(func: ast.FunctionDef, backend_param: str) -> list[str]:
    """The test's own backend lines, copied: its skip when the backend is unavailable, then its set_backend."""
    setup = [ast.unparse(node) for node in ast.walk(func)
             if _call_attr(node) == "set_backend" and backend_param in _names_used(node)][:1]
    available = next((n for n in ast.walk(func) if _call_attr(n) == "is_backend_available"
                      and backend_param in _names_used(n)), None)
    if available is not None:
        setup.insert(0, f"if not {ast.unparse(available)}:\n    pytest.skip(f\"backend {{{backend_param}}} "
                        "is not available\")")
    return setup


def _module_closure(used: set[str], module_assigns: dict[str, ast.stmt]) -> list[ast.stmt]:
    """The module-level assignments the copied code needs, and those they need in turn, in file order."""
    stmts: list[ast.stmt] = []
    frontier = [n for n in used if n in module_assigns]
    while frontier:
        stmt = module_assigns[frontier.pop()]
        if stmt not in stmts:
            stmts.append(stmt)
            frontier += [n for n in _names_used(stmt) if n in module_assigns]
    return sorted(stmts, key=lambda s: s.lineno)


def plan_perf_test(source: str, test_rel: str) -> PerfPlan:
    """The pieces of a perf test for the correctness test in ``source`` (the text of ``test_rel``)."""
    try:
        tree = ast.parse(source, filename=test_rel)
    except SyntaxError as exc:
        raise UsageError(f"{test_rel}:{exc.lineno}: cannot parse the test file ({exc.msg})") from None
    qual, func, call = _find_test(tree)
    imports, module_assigns, module_names = _module_bindings(tree)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    func_params = [a.arg for a in func.args.args if a.arg != "self"]
    notes: list[str] = []

    # The op call: assertCorrectness(test_fn, ref_fn, kwargs, extra_test_kwargs=..., ...).
    keywords = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    op_node = call.args[0] if call.args else keywords.get("test_fn")
    ref_node = call.args[1] if len(call.args) > 1 else keywords.get("ref_fn")
    kwargs_node = call.args[2] if len(call.args) > 2 else keywords.get("kwargs")
    extra_node = call.args[3] if len(call.args) > 3 else keywords.get("extra_test_kwargs")
    extra_ref_node = call.args[4] if len(call.args) > 4 else keywords.get("extra_ref_kwargs")
    tolerance = ", ".join(f"{k}={ast.unparse(keywords[k])}" for k in ("rtol", "atol") if k in keywords)
    if op_node is None or kwargs_node is None:
        raise UsageError(f"{test_rel}:{call.lineno}: {CHECK_CALL} is not called with (test_fn, ref_fn, kwargs)")
    pieces = [op_node, kwargs_node] + ([extra_node] if extra_node is not None else [])
    if any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
           for p in pieces for n in ast.walk(p)):
        raise UsageError(f"{test_rel}:{call.lineno}: the op call uses self.<...>; scaffold-perf copies only "
                         "module-level code", "write the perf test by hand")

    parametrize, backend_param = _plan_parametrize(func, module_names, test_rel, notes)
    decorated = [n for p in parametrize for n in p.argnames.split(",")]
    if not any(not p.pinned for p in parametrize):
        notes.append("no shape parametrization found: the perf test times one case")

    # Statements before the call: keep those the op call needs (closure over assigned names).
    before = _statements_before(func.body, call)
    needed = set().union(*(_names_used(p) for p in pieces))
    # A checked test also evaluates the tolerance and the reference's extra kwargs: what they name is
    # built the same way (``rtol, atol = 1e-5, 1e-7`` before the call).
    checked_pieces = [keywords[k] for k in ("rtol", "atol") if k in keywords] + (
        [extra_ref_node] if extra_ref_node is not None else [])
    if any(isinstance(n, ast.Name) and n.id == "self" for p in checked_pieces for n in ast.walk(p)):
        tolerance, extra_ref_node = "", None  # a checked test then uses torch's tolerances (render says so)
    else:
        needed |= set().union(set(), *(_names_used(p) for p in checked_pieces))
    setup = _needed_statements(before, needed)
    if any(isinstance(n, ast.Name) and n.id == "self" for s in setup for n in ast.walk(s)):
        raise UsageError(f"{test_rel}: the inputs of {func.name} are built with self.<...>",
                         "write the perf test by hand")

    backend_setup = _backend_setup(func, backend_param)
    used = needed | set().union(*(_names_used(ast.parse(s)) for s in backend_setup)) | {
        n for p in parametrize for n in _names_used(ast.parse(p.source[1:], mode="eval"))}
    stmts = _module_closure(used, module_assigns)

    bound = set(decorated) | {backend_param} | module_names | _BUILTINS
    for stmt in setup:
        bound |= _assigned(stmt)
    fixtures = [p for p in func_params if p in (needed - bound)]
    unresolved = needed - bound - set(fixtures)
    if unresolved:
        raise UsageError(f"{test_rel}: the op's inputs use {', '.join(sorted(unresolved))}, which scaffold-perf "
                         "cannot resolve", "write the perf test by hand")
    params = [*decorated, backend_param, *fixtures, "record_property"]
    if "import pytest" not in imports:
        imports.insert(0, "import pytest")
    return PerfPlan(
        source_test="::".join([test_rel, *qual]),
        # A name or attribute is called as it is; anything else (a lambda) needs parentheses.
        op=ast.unparse(op_node) if isinstance(op_node, (ast.Name, ast.Attribute)) else f"({ast.unparse(op_node)})",
        imports=imports,
        module_statements=[ast.unparse(s) for s in stmts], parametrize=parametrize, backend_param=backend_param,
        params=params, backend_setup=backend_setup, setup=[ast.unparse(s) for s in setup],
        kwargs=ast.unparse(kwargs_node), extra_kwargs=ast.unparse(extra_node) if extra_node is not None else "{}",
        no_grad="torch" in module_names, notes=notes,
        reference=_reference_call(ref_node, qual, module_names, defined),
        extra_ref_kwargs=ast.unparse(extra_ref_node) if extra_ref_node is not None else "{}",
        tolerance=tolerance, source_module=Path(test_rel).stem,
    )


def default_output(test_file: Path) -> Path:
    """``tests/ops/test_softmax.py`` -> ``tests/ops/test_softmax_perf.py`` (same folder: relative imports work)."""
    return test_file.with_name(f"{test_file.stem}_perf.py")


def render(plan: PerfPlan, *, command: str, checked: bool = False) -> str:
    """The perf test's source; ``command`` is the line that generated it, written into its header.
    ``checked``: the timed calls are compared with the reference (refused when it is unreachable)."""
    if checked and plan.reference is None:
        raise UsageError(f"{plan.source_test}: the reference passed to {CHECK_CALL} cannot be called from another "
                         "file (a lambda or a local name)", "drop --checked, or write the checked perf test by hand")
    text = load_template(TEMPLATE).render(plan=plan, command=command, checked=checked)
    ast.parse(text)  # a template bug must fail here, not as a collection error in the user's repo
    return text
