"""The signature spec ``compile-check`` compiles a kernel with, when the module has no ``aot_signatures()``.

A **signature spec** (YAML) is written by the user or agent from the tests' shapes, one entry per kernel::

    _silu_and_mul_kernel_row_wise:         # the @ct.kernel function's name
      hints: {occupancy: 2}                # optional: kernel.replace_hints(...)
      signatures:                          # one or more; parameters by name
        - input: float16(65536x8192)       # a contiguous array of the test's shape
          output: float16(65536x4096)
          TILE_SIZE: 4096
          TOTAL_HIDDEN_SIZE: 4096

``float16(65536x8192)`` is a contiguous array of that shape, constrained as the JIT constrains a
fresh torch tensor of it (16-byte aligned base; each dimension divisible by 16 and each stride a
multiple of 16 bytes where they are), so the code compiled is the code the test runs.
``float16[2]`` (block style, or quoted inside ``{...}``) says only the rank: rows a multiple of
16 bytes and nothing of the shape, so bounds checks and load widths may be more cautious than
the JIT's. ``float32`` is a runtime scalar, and a number or bool the value of a ``ct.Constant``
parameter. ``skeleton`` writes a starting spec from the kernel's parameters (ndim guessed from
its ``ct.load``/``ct.gather`` indices).

A signature may carry its own ``hints: {...}`` (merged over the kernel's), so every tuned config
of a kernel (tile constants plus occupancy/num_ctas/...) fits in one spec. A parameter's value is
never a mapping, so a ``hints`` key holding one cannot be mistaken for a parameter of that name.

``recorded_spec`` writes one from the launches ``--record`` saw. Pure: no cuda-tile import here
(``compilecheck`` turns a parsed spec into cuTile signatures).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cutile_perf.errors import UsageError, yaml_problem

_ARRAY = re.compile(r"^(?P<dtype>[a-z]+[0-9]*)\[(?P<ndim>[0-9])\]$")
# A contiguous array of one concrete shape, ``float16(4096x1024)``: no brackets or commas, so it
# needs no quotes in YAML's {...} flow style.
_SHAPED = re.compile(r"^(?P<dtype>[a-z]+[0-9]*)\((?P<dims>[0-9]+(?:x[0-9]+)*)\)$")


@dataclass(frozen=True)
class Param:
    kind: str  # "array", "scalar" or "constant"
    dtype: str | None = None
    ndim: int | None = None
    value: Any = None
    shape: tuple[int, ...] | None = None  # an array given by its shape (``float16(4096x1024)``)

    def spec_text(self) -> str:
        """The parameter in the spec's words."""
        if self.kind == "array":
            return array_text(self.dtype, self.ndim, self.shape)
        return self.dtype if self.kind == "scalar" else repr(self.value)


def array_text(dtype: str, ndim: int, shape: tuple[int, ...] | None = None) -> str:
    """An array in the spec's words: ``float16(4096x1024)`` by its shape, ``float16[2]`` by its rank
    (what ``parse_param`` reads back)."""
    return f"{dtype}({'x'.join(map(str, shape))})" if shape else f"{dtype}[{ndim}]"


def parse_param(name: str, raw: Any) -> Param:
    """One parameter of a spec: ``float16[2]`` array (its rank), ``float16(4096x1024)`` array (its
    shape), ``float32`` scalar, or a constant number/bool."""
    if isinstance(raw, (int, float)):  # bool included
        return Param("constant", value=raw)
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("FILL"):
            raise UsageError(f"parameter {name}: still {text!r} in the spec", "fill it from the test's shapes and dtypes")
        match = _ARRAY.match(text)
        if match:
            return Param("array", match["dtype"], int(match["ndim"]))
        match = _SHAPED.match(text)
        if match:
            shape = tuple(int(d) for d in match["dims"].split("x"))
            if 0 in shape:
                raise UsageError(f"parameter {name}: {raw!r} has an empty dimension")
            return Param("array", match["dtype"], len(shape), shape=shape)
        if re.fullmatch(r"[a-z]+[0-9]*", text):
            return Param("scalar", text)
    raise UsageError(f"parameter {name}: {raw!r} is not float16[2] or float16(4096x1024) (array), float32 (scalar) "
                     "or a constant",
                     "see references/ir-dump.md, 'Compiling without a GPU'")


@dataclass(frozen=True)
class KernelSpec:
    hints: dict  # the kernel's, for every signature
    signatures: list[dict[str, Param]]
    signature_hints: list[dict] = field(default_factory=list)  # per signature, merged over ``hints``

    def hints_for(self, index: int) -> dict:
        own = self.signature_hints[index] if index < len(self.signature_hints) else {}
        return {**self.hints, **own}


def load_spec(path: Path) -> dict[str, KernelSpec]:
    """The spec file as {kernel name: KernelSpec}; a malformed file is a UsageError naming the entry."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise UsageError(f"cannot read the signature spec {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML, {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of kernel name -> {{signatures: [...]}}")
    specs = {}
    for kernel, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("signatures"), list) or not entry["signatures"]:
            raise UsageError(f"{path}: {kernel}: needs a non-empty 'signatures' list")
        unknown = set(entry) - {"hints", "signatures"}
        if unknown:
            raise UsageError(f"{path}: {kernel}: unknown keys {sorted(unknown)}", "allowed: hints, signatures")
        hints = entry.get("hints") or {}
        if not isinstance(hints, dict):
            raise UsageError(f"{path}: {kernel}: hints must be a mapping, e.g. {{occupancy: 2}}")
        sigs, own_hints = [], []
        for i, sig in enumerate(entry["signatures"]):
            if not isinstance(sig, dict):
                raise UsageError(f"{path}: {kernel}: signature {i} must map parameter names to types")
            own = sig.get("hints") if isinstance(sig.get("hints"), dict) else {}
            sigs.append({name: parse_param(f"{kernel}.{name}", raw) for name, raw in sig.items()
                         if not (name == "hints" and isinstance(raw, dict))})
            own_hints.append(dict(own))
        specs[str(kernel)] = KernelSpec(hints, sigs, own_hints)
    return specs


# --- a starting spec from the source ---------------------------------------------------------------


def _constant_names(tree: ast.Module) -> set[str]:
    """Module-level aliases of ``ct.Constant[...]`` (TileGym writes ``ConstInt = ct.Constant[int]``)."""
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and "Constant" in ast.unparse(stmt.value):
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    return names


def _index_ndims(func: ast.FunctionDef) -> dict[str, int]:
    """ndim of each parameter as its first ``ct.load(p, index=(..))``/``ct.gather(p, (..))`` shows it."""
    found: dict[str, int] = {}
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"load", "store", "gather", "scatter"} and node.args):
            continue
        target = node.args[0]
        index = next((kw.value for kw in node.keywords if kw.arg == "index"), node.args[1] if len(node.args) > 1 else None)
        if isinstance(target, ast.Name) and target.id not in found:
            found[target.id] = len(index.elts) if isinstance(index, ast.Tuple) else 1
    return found


def skeleton(source: str, path: str) -> str:
    """A spec to fill in, for every ``@ct.kernel`` in ``source``: constants and dtypes are left as FILL."""
    tree = ast.parse(source, filename=path)
    constants = _constant_names(tree)
    launches: dict[str, list[tuple[int, str]]] = {}
    for node in ast.walk(tree):  # ct.launch(stream, grid, kernel, (args...)): the args name the values to fill
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "launch"
                and len(node.args) >= 4 and isinstance(node.args[2], ast.Name)):
            launches.setdefault(node.args[2].id, []).append((node.lineno, ast.unparse(node.args[3])))
    lines = [f"# compile-check signatures for {path}. Fill every FILL from the shapes and dtypes the tests use;",
             "# arrays: <dtype>(<shape>), the test's shape, e.g. float16(4096x1024) (or <dtype>[<ndim>]: the rank",
             "# only, which hides the shape's divisibility by 16 from the compiler); scalars: float32 / int32;",
             "# ct.Constant: a value."]
    for func in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
        if not any("kernel" in ast.unparse(d) for d in func.decorator_list):
            continue
        ndims = _index_ndims(func)
        lines += [f"# {func.name} is launched at line {line}: ct.launch(..., {func.name}, {args})"
                  for line, args in launches.get(func.name, [])]
        lines += [f"{func.name}:", "  signatures:"]
        for i, arg in enumerate(func.args.args):
            ann = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            if "Constant" in ann or ann in constants:
                value, note = "FILL", f"{ann}: the value the launcher passes for the test's shape"
            elif ann in {"float", "int", "bool"}:
                value, note = {"float": "float32", "int": "int32", "bool": "bool"}[ann], "runtime scalar"
            else:
                ndim = ndims.get(arg.arg)
                value = f"FILL[{ndim}]" if ndim else "FILL"
                note = "array: dtype from the test" + (", ndim from its load/gather index" if ndim else "")
            lead = "    - " if i == 0 else "      "
            lines.append(f"{lead}{arg.arg}: {value}  # {note}")
    return "\n".join(lines) + "\n"


RECORDED_HEADER = "# recorded by cutile-perf compile-check --record from the tests' launches on {arch}; do not edit"


def recorded_spec(found: dict[str, list[dict]], arch: str) -> str:
    """The spec text for recorded launches ({kernel: [params, ...]}): block style, one signature each."""
    body = {kernel: {"signatures": sigs} for kernel, sigs in found.items()}
    return RECORDED_HEADER.format(arch=arch) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def is_recorded(text: str) -> bool:
    """Whether a spec file was written by ``--record`` (so a new recording may replace it)."""
    return text.startswith(RECORDED_HEADER.split("{arch}")[0])


def describe(params: dict[str, Param]) -> str:
    """A signature as one line of the spec's words: ``x=float16(4x64), TILE=64``."""
    return ", ".join(f"{name}={p.spec_text()}" for name, p in params.items())
