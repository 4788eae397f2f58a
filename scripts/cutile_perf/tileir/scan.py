"""Read Triton kernels out of Python source with ``ast``: which functions are kernels, which
``triton.language`` operations they call, and where their autotune configs are.

Names are resolved through the module's imports, so ``tl.dot``, ``triton.language.dot``,
``from triton.language import dot`` and ``import triton.language as lang; lang.dot`` all read as
``dot``. Pure functions over the source text; nothing is imported or executed.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from cutile_perf.errors import UsageError

TL = "triton.language"
JIT_NAMES = {"triton.jit", "triton.runtime.jit", "triton.runtime.jit.jit"}
AUTOTUNE_NAMES = {"triton.autotune", "triton.runtime.autotune", "triton.runtime.autotuner.autotune"}
HEURISTICS_NAMES = {"triton.heuristics", "triton.runtime.heuristics", "triton.runtime.autotuner.heuristics"}
# Tensor methods that triton.language exposes as members (``x.sum(axis=0)`` is ``tl.sum(x, 0)``).
GATE_HELPER = "_cutile_perf_with_tileir_configs"  # inserted by transform.py
REDUCTION_METHODS = {"sum", "max", "min", "argmax", "argmin", "reduce", "cumsum", "cumprod", "xor_sum"}


@dataclass
class Autotune:
    """The ``@triton.autotune(...)`` decorator of a kernel, with source offsets of ``configs=``."""

    configs_node: ast.expr | None
    literal_config_count: int | None  # None when configs is not a list/tuple literal
    key: list[str] | None
    # Arguments the autotuner zeroes / restores around each timed run (literal string lists only).
    reset_to_zero: list[str] = field(default_factory=list)
    restore_value: list[str] = field(default_factory=list)


@dataclass
class Kernel:
    name: str
    lineno: int
    params: list[str]
    ops: dict[str, int] = field(default_factory=dict)  # triton.language op (short name) -> call count
    method_reductions: dict[str, int] = field(default_factory=dict)
    loaded_params: set[str] = field(default_factory=set)
    stored_params: set[str] = field(default_factory=set)
    atomic_params: set[str] = field(default_factory=set)  # pointer arguments written with tl.atomic_*
    reduced_names: set[str] = field(default_factory=set)  # variables assigned from a reduction
    divided_by_reduction: bool = False
    autotune: Autotune | None = None
    uses_occupancy: bool = False


@dataclass
class Module:
    kernels: list[Kernel]
    functions: list[ast.FunctionDef]  # every top-level function, kernels included
    aliases: dict[str, str]
    tree: ast.Module


def parse(source: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise UsageError(f"the kernel source does not parse: line {exc.lineno}: {exc.msg}",
                         "pass a complete Python module (imports included)") from None


def import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted origin, from every import statement in the module."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:  # ``import triton.language`` binds ``triton``
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The dotted name an expression refers to, with its first part resolved through imports."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def tl_op(name: str | None) -> str | None:
    """``triton.language.math.exp`` -> ``exp``; None for anything outside triton.language."""
    if not name or not name.startswith(TL + "."):
        return None
    return name.rsplit(".", 1)[-1]


def _pointer_operand(node: ast.AST, params: set[str], local_bases: dict[str, str]) -> str | None:
    """The pointer an ``ptr + offset`` expression starts from: a bare name among the terms of a sum
    (``x_ptr + row * stride + cols``); products and calls are offsets, never the pointer."""
    if isinstance(node, ast.Name):
        return node.id if node.id in params else local_bases.get(node.id)
    if isinstance(node, ast.Subscript):  # ptrs[:, None]
        return _pointer_operand(node.value, params, local_bases)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return (_pointer_operand(node.left, params, local_bases)
                or _pointer_operand(node.right, params, local_bases))
    return None


def _base_param(node: ast.AST, params: set[str], local_bases: dict[str, str] | None = None) -> str | None:
    """The kernel parameter a pointer expression is built from (``x_ptr + offs`` -> ``x_ptr``), also
    through a local pointer variable (``ptrs = x_ptr + offs; tl.store(ptrs, ...)`` -> ``x_ptr``)."""
    return _pointer_operand(node, params, local_bases or {}) or next(
        (sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name) and sub.id in params), None)


def _local_pointer_bases(fn: ast.FunctionDef, params: set[str]) -> dict[str, str]:
    """Local names assigned a pointer expression over a parameter (``c_ptrs = c_ptr + offs``), in order."""
    bases: dict[str, str] = {}
    for node in _walk_body(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            base = None if name in params else _pointer_operand(node.value, params, bases)
            if base:
                bases[name] = base
    return bases


def _string_list(node: ast.expr | None) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]  # triton accepts one name too
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _autotune(node: ast.Call) -> Autotune:
    configs = next((kw.value for kw in node.keywords if kw.arg == "configs"), node.args[0] if node.args else None)
    key_node = next((kw.value for kw in node.keywords if kw.arg == "key"), node.args[1] if len(node.args) > 1 else None)
    listed = configs
    # Our own gate wraps the original list; where the gate is false that list is what autotune sees.
    if isinstance(listed, ast.Call) and isinstance(listed.func, ast.Name) and listed.func.id == GATE_HELPER \
            and listed.args:
        listed = listed.args[0]
    count = len(listed.elts) if isinstance(listed, (ast.List, ast.Tuple)) else None
    key = None
    if isinstance(key_node, (ast.List, ast.Tuple)):
        key = [e.value for e in key_node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    keywords = {kw.arg: kw.value for kw in node.keywords}
    return Autotune(configs_node=configs, literal_config_count=count, key=key,
                    reset_to_zero=_string_list(keywords.get("reset_to_zero")),
                    restore_value=_string_list(keywords.get("restore_value")))


def _mentions_occupancy(node: ast.AST) -> bool:
    return any((isinstance(sub, ast.keyword) and sub.arg == "occupancy")
               or (isinstance(sub, ast.Constant) and sub.value == "occupancy") for sub in ast.walk(node))


def _walk_body(fn: ast.FunctionDef):
    """Every node of the body, not of the decorators (their lambdas are host code)."""
    for stmt in fn.body:
        yield from ast.walk(stmt)


def _is_tensor_method(func: ast.expr, aliases: dict[str, str]) -> bool:
    """``x.sum(...)`` on a tensor, as opposed to ``np.sum`` or ``tl.sum`` (a module attribute)."""
    if not isinstance(func, ast.Attribute) or func.attr not in REDUCTION_METHODS:
        return False
    base = func.value
    while isinstance(base, ast.Attribute):
        base = base.value
    return not (isinstance(base, ast.Name) and base.id in aliases)


def _scan_body(kernel: Kernel, fn: ast.FunctionDef, aliases: dict[str, str]) -> None:
    params = set(kernel.params)
    local_bases = _local_pointer_bases(fn, params)
    for node in _walk_body(fn):
        if isinstance(node, ast.Call):
            name = dotted(node.func, aliases)
            op = tl_op(name)
            if op:
                kernel.ops[op] = kernel.ops.get(op, 0) + 1
                if op in {"load", "store"} or op.startswith("atomic_"):
                    target = node.args[0] if node.args else None
                    base = _base_param(target, params, local_bases) if target is not None else None
                    if base:
                        (kernel.loaded_params if op == "load" else kernel.stored_params).add(base)
                        if op.startswith("atomic_"):
                            kernel.loaded_params.add(base)
                            kernel.atomic_params.add(base)
            elif _is_tensor_method(node.func, aliases):
                kernel.method_reductions[node.func.attr] = kernel.method_reductions.get(node.func.attr, 0) + 1
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            op = tl_op(dotted(node.value.func, aliases))
            method = node.value.func.attr if isinstance(node.value.func, ast.Attribute) else None
            if op in {"sum", "max", "min"} or method in {"sum", "max", "min"}:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        kernel.reduced_names.add(target.id)
    # Division by a reduced value (``x / tl.sum(x)``, ``x / denom`` with ``denom = tl.sum(...)``)
    # or multiplication by rsqrt of one is what normalises.
    for node in _walk_body(fn):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if isinstance(right, ast.Name) and right.id in kernel.reduced_names:
                kernel.divided_by_reduction = True
            if isinstance(right, ast.Call) and tl_op(dotted(right.func, aliases)) in {"sum", "max"}:
                kernel.divided_by_reduction = True


def scan(source: str) -> Module:
    """Every ``@triton.jit`` kernel in ``source`` (through autotune/heuristics stacks), in order."""
    tree = parse(source)
    aliases = import_aliases(tree)
    kernels: list[Kernel] = []
    functions: list[ast.FunctionDef] = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        functions.append(fn)
        names = [dotted(d.func if isinstance(d, ast.Call) else d, aliases) or "?" for d in fn.decorator_list]
        if not any(n in JIT_NAMES for n in names):
            continue
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
        kernel = Kernel(name=fn.name, lineno=fn.lineno, params=params)
        for dec, name in zip(fn.decorator_list, names):
            if name in AUTOTUNE_NAMES and isinstance(dec, ast.Call):
                kernel.autotune = _autotune(dec)
                kernel.uses_occupancy = kernel.uses_occupancy or _mentions_occupancy(dec)
            elif name in HEURISTICS_NAMES and isinstance(dec, ast.Call):
                kernel.uses_occupancy = kernel.uses_occupancy or _mentions_occupancy(dec)
        _scan_body(kernel, fn, aliases)
        kernels.append(kernel)
    return Module(kernels=kernels, functions=functions, aliases=aliases, tree=tree)
