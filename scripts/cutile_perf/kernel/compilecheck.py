"""Compile a kernel file's ``@ct.kernel`` functions for a target arch without a GPU, and say what came out.

``KernelSignature.from_kernel_args`` needs the CUDA driver, so the signatures are built by hand,
from one of two sources, and every result names its source:

* ``aot_signatures()`` in the kernel module (the bundled kernels have one), or
* a **signature spec** (YAML) the user or agent writes from the tests' shapes, read by
  ``signature_spec``; ``skeleton`` there writes a starting one.

A candidate file kept outside the package (``sandbox/cand/x.py``) is imported *as* the file it
would replace (``import_kernel_module(..., as_path=...)``): under that module's dotted name, with
``<repo>/src`` on ``sys.path``, so its absolute and relative imports resolve as they would in place.

Compilation exports TileIR bytecode with the public ``export_kernel``, then runs tileiras through
cuTile's own ``compile_cubin`` (private, cuda-tile 1.7) to also get the optimization remarks (TMA
chosen or not, tensor cores). ``cuobjdump`` (on PATH, from the ``nvidia-cuda-cuobjdump`` package,
or the copy triton's wheel ships) adds registers, spills, threads per block and SASS load/store
widths; ``compile_report`` parses both (pure functions, tested on captured text).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import textwrap
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutile_perf.kernel.compile_report import inspect_cubin, summarize_remarks
from cutile_perf.kernel.signature_spec import Param
from cutile_perf.errors import EnvMissing, UsageError
from cutile_perf.child import envcheck

DEFAULT_ARCH = "sm_90"
# What cuTile's JIT asks of a dimension and a stride when it specializes on a tensor (cuda-tile 1.7:
# a shape divisible by 16, a stride that is a multiple of 16 bytes).
JIT_DIVISOR = 16
_ARCH = re.compile(r"^sm_[0-9]{2,3}[a-z]?$")


# --- building signatures ---------------------------------------------------------------------------


def _dtype(name: str):
    import cuda.tile as ct

    dtype = getattr(ct, name, None)
    if dtype is None or not hasattr(dtype, "bitwidth"):
        raise UsageError(f"{name!r} is not a cuda.tile dtype", "e.g. float16, bfloat16, float32, int32")
    return dtype


def contiguous_array(dtype_name: str, ndim: int, shape: tuple[int, ...] | None = None):
    """ArrayConstraint of a fresh contiguous torch tensor: with ``shape``, what the JIT infers from
    one of that shape (a dimension divisible by 16 is said to be, a stride that is a multiple of 16
    bytes too); without, only that its rows are a multiple of 16 bytes and nothing of its shape, so
    the compiled code may check and load more narrowly than the JIT's for the test's shapes."""
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint

    dtype = _dtype(dtype_name)
    per_16_bytes = max(1, JIT_DIVISOR // max(1, dtype.bitwidth // 8))
    if shape is None:
        strides_divisible = [per_16_bytes] * (ndim - 1) + [1]
        stride_constant = [None] * (ndim - 1) + [1]
        shape_divisible = [1] * ndim
    else:
        strides = [1] * ndim
        for axis in range(ndim - 2, -1, -1):
            strides[axis] = strides[axis + 1] * shape[axis + 1]
        strides_divisible = [per_16_bytes if stride % per_16_bytes == 0 else 1 for stride in strides]
        stride_constant = [1 if stride == 1 else None for stride in strides]
        shape_divisible = [JIT_DIVISOR if dim % JIT_DIVISOR == 0 else 1 for dim in shape]
    return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=[],
                           may_alias_internally=False, stride_constant=stride_constant,
                           stride_divisible_by=strides_divisible, shape_divisible_by=shape_divisible,
                           base_addr_divisible_by=16)


def kernel_params(kernel) -> list[tuple[str, bool]]:
    """(name, is ct.Constant) for each parameter of a cuTile kernel object, in order."""
    fn = kernel._annotated_function  # cuda-tile 1.7: the parsed signature and per-parameter annotations
    return [(name, bool(ann.constant)) for name, ann in zip(fn.pysig.parameters, fn.parameter_annotations)]


def build_signature(kernel, kernel_name: str, params: dict[str, Param]):
    """A KernelSignature for ``kernel`` from spec ``params``; missing/extra/mistyped ones are UsageErrors."""
    from cuda.tile.compilation import CallingConvention, ConstantConstraint, KernelSignature, ScalarConstraint

    expected = kernel_params(kernel)
    names = [n for n, _ in expected]
    missing = [n for n in names if n not in params]
    extra = [n for n in params if n not in names]
    if missing or extra:
        raise UsageError(f"{kernel_name}: spec parameters do not match the kernel ({', '.join(names)})"
                         + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else ""))
    built = []
    for name, constant in expected:
        p = params[name]
        if constant != (p.kind == "constant"):
            want = "a constant value" if constant else "an array or scalar type"
            raise UsageError(f"{kernel_name}.{name}: expected {want}, got {p.kind}")
        if p.kind == "array":
            built.append(contiguous_array(p.dtype, p.ndim, p.shape))
        elif p.kind == "scalar":
            built.append(ScalarConstraint(_dtype(p.dtype)))
        else:
            built.append(ConstantConstraint(p.value))
    return KernelSignature(built, CallingConvention.cutile_python_v1())


# --- importing the kernel file ---------------------------------------------------------------------


def package_parts(repo: Path, path: Path) -> list[str]:
    """The package names of a file under ``<repo>/src/`` inside packages (``["pkg", "ops", "cutile"]``
    for ``src/pkg/ops/cutile/x.py``); [] for a file outside ``src/`` or outside a package chain."""
    path = Path(path).resolve()
    src = (Path(repo) / "src").resolve()
    if not path.is_relative_to(src):
        return []
    parts: list[str] = []
    folder = path.parent
    while folder != src and (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return parts if folder == src else []


def _forget(top: str) -> None:
    """Drop a package and its modules from ``sys.modules``: a copy imported earlier (installed, or
    from another checkout) would shadow the files being checked."""
    for name in list(sys.modules):
        if name == top or name.startswith(top + "."):
            del sys.modules[name]


def import_kernel_module(repo: Path, path: Path, as_path: Path | None = None):
    """The kernel file as a module, imported from ``path`` itself (never from another installed copy).

    A file under ``<repo>/src/`` inside packages is imported by its dotted name with ``<repo>/src``
    first on ``sys.path``, so its relative imports work; anything else by file location.

    ``as_path``: the file ``path`` would replace (a candidate kept in ``sandbox/``). ``path`` is then
    loaded under ``as_path``'s dotted name, with ``<repo>/src`` (or, outside ``src/``, ``as_path``'s
    folder) first on ``sys.path``: its imports resolve as they would in place, and neither file is
    written. ``sys.path`` is restored afterwards; the modules stay loaded for the compile.
    """
    path = path.resolve()
    target = (as_path or path).resolve()
    src = (repo / "src").resolve()
    parts = package_parts(repo, target)
    saved_path = list(sys.path)
    try:
        if parts:
            sys.path.insert(0, str(src))
            _forget(parts[0])
        if parts and target == path:
            module = importlib.import_module(".".join([*parts, path.stem]))
        else:
            if parts:
                name = ".".join([*parts, target.stem])
                importlib.import_module(".".join(parts))  # the parent package first, as an import in place would
            elif as_path is not None:
                name = target.stem
                sys.path.insert(0, str(target.parent))  # its sibling modules, as in place
            else:
                name = "_cutile_perf_compile_check_" + re.sub(r"\W", "_", path.stem)
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    except Exception as exc:  # the user's module: any import error is a result to report, not our bug
        hint = "compile-check imports the kernel module (it needs cuda-tile, and torch if the module uses it)"
        if as_path is None and not parts and isinstance(exc, ImportError):
            hint = ("a candidate kept outside the package imports like the file it replaces: "
                    "pass --as <that file>, e.g. --as src/<pkg>/ops/cutile/<op>.py")
        shown = f"{path} as {target}" if as_path is not None else str(path)
        raise UsageError(f"cannot import {shown}: {type(exc).__name__}: {str(exc)[:300]}", hint)
    finally:
        sys.path[:] = saved_path
    if Path(module.__file__).resolve() != path:
        raise UsageError(f"importing {path} loaded {module.__file__} instead",
                         "another copy of the package is first on the path; compile-check refuses to check the wrong file")
    return module


def kernels_in(module) -> dict[str, Any]:
    """{function name: kernel object} for the cuTile kernels defined in ``module``."""
    import cuda.tile as ct

    return {value._pyfunc.__name__: value for value in vars(module).values()
            if isinstance(value, ct.kernel) and value._pyfunc.__module__ == module.__name__}


# --- compiling -------------------------------------------------------------------------------------


@dataclass
class Result:
    kernel: str
    signature: str  # the parameters, as written
    source: str  # "aot_signatures()" or the spec file
    hints: dict = field(default_factory=dict)  # replace_hints(...) applied for this signature
    ok: bool = False
    error: str = ""
    checked: bool = True  # False: no signature to compile with (not a compile failure)
    seconds: float = 0.0
    remarks: dict = field(default_factory=dict)
    cubin: dict = field(default_factory=dict)  # registers, stack, shared, threads, sass

    def to_dict(self) -> dict:
        return dict(vars(self))


def compile_signature(kernel, signature, arch: str, workdir: Path) -> tuple[bytes, str | None]:
    """(cubin, remarks YAML text or None when none could be asked for); cuTile's compile errors propagate."""
    from cuda.tile.compilation import export_kernel

    bytecode = workdir / "kernel.tileirbc"
    export_kernel(kernel, [signature], str(bytecode), gpu_code=arch, output_format="tileir_bytecode")
    remarks_file = workdir / "remarks.yaml"
    try:
        from cuda.tile._compile import compile_cubin  # private: the only call that passes --remarks
    except ImportError:
        cubin_path = workdir / "kernel.cubin"
        export_kernel(kernel, [signature], str(cubin_path), gpu_code=arch, output_format="cubin")
        return cubin_path.read_bytes(), None
    cubin_path = compile_cubin(str(bytecode), kernel._compiler_options, arch, timeout_sec=300,
                               remarks_output_file=remarks_file)
    # tileiras writes the file even when it has nothing to say (no tiled load or store, no MMA).
    remarks = remarks_file.read_text(encoding="utf-8", errors="replace") if remarks_file.exists() else None
    return Path(cubin_path).read_bytes(), remarks


# tileiras' bare "failed to compile Tile IR program" (exit 5) says nothing about the cause. Calls it
# is known to refuse, each found on the H200 toolchain (tileiras 13.4), get named next to it.
_SILENT_FAILURE = "failed to compile Tile IR program"


def known_compile_traps(func_source: str, first_line: int = 1) -> list[str]:
    """Calls in a kernel's source that tileiras 13.4 refuses without saying why (pure; ``first_line``:
    the source's line number in its file)."""
    try:
        tree = ast.parse(textwrap.dedent(func_source))
    except SyntaxError:
        return []
    traps = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        unchecked = keywords.get("check_bounds")
        if "padding_mode" in keywords and isinstance(unchecked, ast.Constant) and unchecked.value is False:
            traps.append(f"line {first_line + node.lineno - 1}: a load with padding_mode and check_bounds=False "
                         "(tileiras 13.4 refuses the pair; drop padding_mode, nothing is out of bounds there)")
    return traps


def _kernel_traps(kernel) -> list[str]:
    """known_compile_traps of a @ct.kernel's Python function; [] when its source cannot be read."""
    func = getattr(kernel, "_pyfunc", None)  # cuda-tile 1.7 keeps the decorated function there
    try:
        lines, start = inspect.getsourcelines(func)
    except (OSError, TypeError):
        return []
    return known_compile_traps("".join(lines), start)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:400]


def check_kernel(kernel, name: str, signatures: list[tuple], *, source: str, arch: str, hints: dict,
                 cuobjdump: Path | None) -> list[Result]:
    """Compile every signature of one kernel; each gives a Result (a failure is a result, not an exception).

    ``signatures``: ``(label, signature)`` pairs compiled with ``hints``, or ``(label, signature,
    hints)`` triples that carry their own (a spec's per-signature hints, already merged).
    """
    results = []
    hinted: dict[str, Any] = {}  # one replace_hints per distinct set of hints
    for item in signatures:
        label, signature = item[0], item[1]
        own = item[2] if len(item) > 2 else hints
        result = Result(name, label, source, hints=dict(own))
        key = repr(sorted(own.items()))
        if key not in hinted:
            try:
                hinted[key] = kernel.replace_hints(**own) if own else kernel
            except Exception as exc:
                hinted[key] = exc
        if isinstance(hinted[key], Exception):
            result.error = f"hints {own}: {_one_line(hinted[key])}"
            results.append(result)
            continue
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cutile-perf-cc-") as tmp:
            try:
                cubin, remarks = compile_signature(hinted[key], signature, arch, Path(tmp))
            except Exception as exc:
                result.error = _one_line(exc)
                if _SILENT_FAILURE in result.error and (traps := _kernel_traps(kernel)):
                    result.error += "; likely cause: " + "; ".join(traps)
            else:
                result.ok = True
                result.remarks = summarize_remarks(remarks) if remarks is not None else {"note": "no remarks asked"}
                if cuobjdump is not None:
                    path = Path(tmp) / "kernel.cubin"
                    path.write_bytes(cubin)
                    result.cubin = inspect_cubin(path, cuobjdump)
                else:
                    result.cubin = {"note": "cuobjdump not found: no registers, threads or SASS"}
        result.seconds = round(time.perf_counter() - start, 2)
        results.append(result)
    return results


def default_arch(compute_capability: str | None) -> str:
    """``sm_90`` from "9.0"; DEFAULT_ARCH when unknown."""
    if compute_capability and re.fullmatch(r"\d+\.\d+", compute_capability):
        major, minor = compute_capability.split(".")
        return f"sm_{major}{minor}"
    return DEFAULT_ARCH


def check_arch(arch: str) -> str:
    if not _ARCH.match(arch):
        raise UsageError(f"--arch {arch!r}: expected a name like sm_90 or sm_100")
    return arch


def require_toolchain() -> None:
    try:
        import cuda.tile  # noqa: F401
        from cuda.tile.compilation import export_kernel  # noqa: F401
    except Exception as exc:
        raise EnvMissing(f"cuda-tile is not importable ({type(exc).__name__})",
                         f"{envcheck.INSTALL_HINT} (the gpu extra's pins); no GPU is needed") from None
