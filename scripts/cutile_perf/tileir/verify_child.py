"""Child process of ``verify-triton``: import the kernel module, run its entry point and the torch
reference on generated inputs, print one result line.

It runs in its own process because ``TRITON_INTERPRET`` and ``ENABLE_TILE`` are read when triton
is imported and when the first kernel compiles; the parent sets them in this process's
environment. Usage: ``python -m cutile_perf.tileir.verify_child SPEC.json``.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
import traceback
from pathlib import Path
from typing import Any

RESULT_PREFIX = "CUTILE_PERF_VERIFY_RESULT "


def _load_module(path: Path):
    sys.path.insert(0, str(path.parent))  # the kernel file may import its siblings
    spec = importlib.util.spec_from_file_location("cutile_perf_verify_target", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def patch_interpreter_scalar_index() -> bool:
    """Let the Triton CPU interpreter use a runtime scalar as a loop bound under numpy >= 2.4.

    The interpreter (triton 3.6) holds kernel scalars as one-element 1-d arrays and converts them
    with ``int(array)``, which numpy 2.4 turned into a TypeError; so ``for k in range(0, K, BLOCK)``
    fails in the interpreter although it compiles fine. This re-points ``tensor.__index__`` at
    ``.item()`` each time the interpreter patches triton.language. Returns whether it applied.
    """
    try:
        from triton.runtime import interpreter
    except Exception:
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_cutile_perf_patched", False):
        return original is not None

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._cutile_perf_patched = True
    interpreter._patch_lang_tensor = patched
    return True


def _make_input(torch, shape: list[int], dtype_name: str, generator, device: str):
    dtype = getattr(torch, dtype_name)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype).to(device)
    if dtype == torch.bool:
        return (torch.rand(shape, generator=generator) > 0.5).to(device)
    return torch.randint(-8, 8, shape, generator=generator, dtype=torch.int64).to(dtype).to(device)


def _tensors(value) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def compare(torch, outputs, references, atol: float, rtol: float) -> dict[str, Any]:
    """Max absolute and relative difference and an allclose verdict over every output tensor.

    The relative difference is taken where ``|reference| > atol``: near zero it only restates the
    absolute difference and would blow up.
    """
    outs, refs = _tensors(outputs), _tensors(references)
    if len(outs) != len(refs):
        return {"passed": False, "error": f"the entry returned {len(outs)} tensor(s), the reference {len(refs)}"}
    max_abs = max_rel = 0.0
    passed = True
    for out, ref in zip(outs, refs):
        if not torch.is_tensor(out):
            return {"passed": False, "error": f"the entry returned {type(out).__name__}, not a tensor"}
        ref = torch.as_tensor(ref, device=out.device)
        if tuple(out.shape) != tuple(ref.shape):
            return {"passed": False, "error": f"shape {list(out.shape)} != reference shape {list(ref.shape)}"}
        o, r = out.double(), ref.double()
        diff = (o - r).abs()
        if diff.numel():
            max_abs = max(max_abs, float(diff.max()))
            big = r.abs() > atol
            if bool(big.any()):
                max_rel = max(max_rel, float((diff[big] / r.abs()[big]).max()))
        passed = passed and bool(torch.allclose(o, r, atol=atol, rtol=rtol, equal_nan=True))
    if math.isnan(max_abs):
        passed = False
    return {"passed": passed, "max_abs_diff": max_abs, "max_rel_diff": max_rel, "error": None}


def _target_backend() -> str | None:
    try:
        from triton import knobs as triton_knobs

        if getattr(triton_knobs.runtime, "interpret", False):
            return "interpreter"
        from triton.runtime import driver

        return driver.active.get_current_target().backend
    except Exception:
        return None


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    if spec["device"] == "cpu":
        patch_interpreter_scalar_index()
    module = _load_module(Path(spec["kernel"]))
    entry = getattr(module, spec["entry"])
    device = spec["device"]
    cases = []
    for case in spec["cases"]:
        generator = torch.Generator().manual_seed(spec["seed"])
        inputs = {name: _make_input(torch, shape, case["dtypes"][name], generator, device)
                  for name, shape in case["shapes"].items()}
        result: dict[str, Any] = {"shapes": case["shapes"], "dtypes": case["dtypes"]}
        try:
            # The reference sees clones: an in-place kernel must not change what it is compared with.
            scope = {"torch": torch, "F": torch.nn.functional, "math": math}
            reference = eval(spec["reference"], scope, {k: v.clone() for k, v in inputs.items()})  # noqa: S307
        except Exception as exc:
            result.update(passed=False, error=f"reference failed: {type(exc).__name__}: {exc}")
            cases.append(result)
            continue
        try:
            output = entry(*inputs.values())
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:
            tail = traceback.format_exc().strip().splitlines()[-1]
            result.update(passed=False, error=f"entry failed: {type(exc).__name__}: {exc}"[:2000], last_line=tail)
            cases.append(result)
            continue
        result.update(compare(torch, output, reference, case["atol"], case["rtol"]))
        cases.append(result)
    return {"target_backend": _target_backend(), "cases": cases}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        result = run(spec)
    except Exception as exc:  # import of the kernel module failed: one result, not a traceback
        result = {"target_backend": None, "cases": [], "error": f"{type(exc).__name__}: {exc}"[:2000]}
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
