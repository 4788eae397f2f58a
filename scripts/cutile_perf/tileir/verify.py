"""``verify-triton``: run a Triton kernel's host entry point against a torch reference.

Entry-point convention: the kernel module defines a host function that takes the inputs
positionally, in the order of the ``--shapes`` keys, launches the kernel(s) and returns a tensor
(or a tuple of tensors). ``--entry`` names it; by default it is the first public top-level function
that launches a ``@triton.jit`` kernel (``kernel[grid](...)``). The reference is a torch expression
over the same input names (``torch``, ``F`` = torch.nn.functional and ``math`` are in scope).

Each backend pass runs in a child process (``verify_child``): ``ENABLE_TILE=0`` always, and
``ENABLE_TILE=1`` only when the TileIR backend is installed. Without a GPU, the child runs the
kernel in the Triton CPU interpreter (``TRITON_INTERPRET=1``), where that can work.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cutile_perf import knobs
from cutile_perf.child import runner
from cutile_perf.errors import UsageError
from cutile_perf.tileir import check, scan
from cutile_perf.tileir.verify_child import RESULT_PREFIX

# Default tolerances per dtype: loose enough for a different accumulation order, tight enough to
# catch a wrong mask or a missing transpose.
TOLERANCES = {"float64": (1e-8, 1e-7), "float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)}
DTYPES = {"float64", "float32", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool"}


def _load_json(text: str, what: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}", f"example: {what} '{{\"x\": [1024]}}'") from None


def parse_cases(shapes_json: str, dtypes_json: str | None, atol: float | None, rtol: float | None) -> list[dict]:
    """``--shapes`` (one ``{name: shape}`` or a list of them) and ``--dtypes`` into test cases."""
    shapes = _load_json(shapes_json, "--shapes")
    shape_sets = shapes if isinstance(shapes, list) else [shapes]
    dtypes = _load_json(dtypes_json, "--dtypes") if dtypes_json else {}
    if not shape_sets or not all(isinstance(s, dict) and s for s in shape_sets):
        raise UsageError("--shapes must be an object {name: shape} or a non-empty list of such objects")
    cases = []
    for shape_set in shape_sets:
        case_dtypes = {}
        for name, shape in shape_set.items():
            if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
                raise UsageError(f"--shapes: {name} must be a list of non-negative integers, got {shape!r}")
            dtype = dtypes if isinstance(dtypes, str) else dtypes.get(name, "float32")
            if dtype not in DTYPES:
                raise UsageError(f"--dtypes: {name}: unknown dtype {dtype!r}", "one of " + ", ".join(sorted(DTYPES)))
            case_dtypes[name] = dtype
        floats = [d for d in case_dtypes.values() if d in TOLERANCES]
        loosest = max(floats, key=lambda d: TOLERANCES[d][0]) if floats else "float32"
        cases.append({"shapes": shape_set, "dtypes": case_dtypes,
                      "atol": atol if atol is not None else TOLERANCES[loosest][0],
                      "rtol": rtol if rtol is not None else TOLERANCES[loosest][1]})
    return cases


def _launched_kernels(fn: ast.FunctionDef, kernel_names: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            target = node.func.value
            if isinstance(target, ast.Name) and target.id in kernel_names:
                found.add(target.id)
    return found


def find_entry(module: scan.Module, entry: str | None) -> str:
    kernel_names = {k.name for k in module.kernels}
    if entry:
        if not any(fn.name == entry for fn in module.functions):
            raise UsageError(f"--entry {entry}: no top-level function of that name in the kernel file")
        if entry in kernel_names:
            raise UsageError(f"--entry {entry} is the @triton.jit kernel itself; name the host function "
                             "that launches it")
        return entry
    for fn in module.functions:
        if not fn.name.startswith("_") and fn.name not in kernel_names and _launched_kernels(fn, kernel_names):
            return fn.name
    raise UsageError("no public function launches a kernel (kernel[grid](...)) in the kernel file",
                     "pass --entry NAME of the host function that takes the inputs and returns the output")


def interpreter_blockers(module: scan.Module) -> list[str]:
    """Why the CPU interpreter cannot run this module's kernels, if it cannot."""
    reasons = []
    for k in module.kernels:
        if k.autotune is not None and k.autotune.literal_config_count != 1:
            count = k.autotune.literal_config_count
            what = f"{count} configs" if count is not None else "configs built at import time"
            reasons.append(f"{k.name} is autotuned over {what}: choosing among them needs a GPU to time them "
                           "(the interpreter has no benchmarker)")
        if "inline_asm_elementwise" in k.ops:
            reasons.append(f"{k.name} uses tl.inline_asm_elementwise, which the interpreter cannot run")
    return reasons


def _run_pass(spec: dict, env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    env = runner.with_package_on_path(env)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(spec, fh)
        spec_path = fh.name
    try:
        proc = subprocess.run([sys.executable, "-m", "cutile_perf.tileir.verify_child", spec_path],
                              capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "error", "reason": f"timed out after {timeout_s:.0f} s", "cases": []}
    finally:
        Path(spec_path).unlink(missing_ok=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"status": "error", "reason": f"child exited {proc.returncode}: " + " | ".join(tail), "cases": []}
    result = json.loads(line[len(RESULT_PREFIX):])
    cases = result.get("cases", [])
    if result.get("error"):
        status, reason = "error", f"the kernel module failed to import: {result['error']}"
    else:
        status = "passed" if cases and all(c.get("passed") for c in cases) else "failed"
        reason = None
    measured = [c for c in cases if "max_abs_diff" in c]
    return {"status": status, "reason": reason, "target_backend": result.get("target_backend"), "cases": cases,
            "max_abs_diff": max((c["max_abs_diff"] for c in measured), default=None),
            "max_rel_diff": max((c["max_rel_diff"] for c in measured), default=None)}


def verify(kernel: Path, reference: str, shapes_json: str, dtypes_json: str | None, *, entry: str | None = None,
           device: str = "auto", tileir: bool = True, atol: float | None = None, rtol: float | None = None,
           seed: int = 0, timeout_s: float = 600.0) -> dict[str, Any]:
    """Both passes' results; ``passed`` is true only if every pass that ran passed and at least one ran."""
    if not kernel.is_file():
        raise UsageError(f"--kernel {kernel}: no such file")
    try:
        compile(reference, "--reference", "eval")
    except SyntaxError as exc:
        raise UsageError(f"--reference is not a Python expression: {exc.msg}") from None
    module = scan.scan(kernel.read_text(encoding="utf-8"))
    entry_name = find_entry(module, entry)
    cases = parse_cases(shapes_json, dtypes_json, atol, rtol)
    gpu_name = check.gpu()["name"]
    mode = {"auto": "gpu" if gpu_name else "interpreter", "gpu": "gpu", "interpreter": "interpreter"}[device]
    report: dict[str, Any] = {"kernel": str(kernel), "entry": entry_name, "reference": reference, "mode": mode,
                              "gpu": gpu_name}
    blockers = interpreter_blockers(module) if mode == "interpreter" else []
    report["interpreter_blockers"] = blockers
    spec = {"kernel": str(kernel.resolve()), "entry": entry_name, "reference": reference, "cases": cases,
            "seed": seed, "device": "cuda" if mode == "gpu" else "cpu"}
    interpret = "1" if mode == "interpreter" else "0"
    if mode == "gpu" and not gpu_name:
        report["ptx"] = {"status": "not run", "reason": "no CUDA GPU visible to torch", "cases": []}
    elif blockers:
        report["ptx"] = {"status": "not run", "reason": "CPU interpreter cannot run this module: " + "; ".join(blockers),
                         "cases": []}
    else:
        report["ptx"] = _run_pass(spec, knobs.child_env(ENABLE_TILE="0", TRITON_INTERPRET=interpret), timeout_s)
    report["ptx"]["enable_tile"] = "0"
    report["tileir"] = _tileir_pass(spec, mode, tileir, timeout_s)
    ran = [p for p in (report["ptx"], report["tileir"]) if p["status"] != "not run"]
    report["passed"] = bool(ran) and all(p["status"] == "passed" for p in ran)
    report["ran"] = bool(ran)
    return report


def _tileir_pass(spec: dict, mode: str, wanted: bool, timeout_s: float) -> dict[str, Any]:
    if not wanted:
        return {"status": "not run", "reason": "not requested (--no-tileir)", "cases": [], "enable_tile": "1"}
    if mode != "gpu":
        return {"status": "not run", "reason": "TileIR backend unavailable: needs a GPU (the interpreter has no "
                                               "TileIR path)", "cases": [], "enable_tile": "1"}
    if not check.tileir_backend_module()["present"]:
        return {"status": "not run", "reason": "TileIR backend unavailable: the active triton has no "
                                               "triton.backends.tileir", "cases": [], "enable_tile": "1"}
    result = _run_pass(spec, knobs.child_env(ENABLE_TILE="1", TRITON_INTERPRET="0"), timeout_s)
    if result.get("target_backend") not in (None, "tileir"):
        # ENABLE_TILE=1 fell back to another backend: the numbers are not a TileIR validation.
        result = {"status": "not run", "cases": [], "reason": "TileIR backend unavailable: with ENABLE_TILE=1 the "
                                                              f"active target was {result['target_backend']}"}
    result["enable_tile"] = "1"
    return result
