"""Record the signature of every distinct ``ct.launch`` a test run makes: what compile-check needs.

``KernelSignature.from_kernel_args`` needs the CUDA driver, so a machine without a GPU cannot
derive signatures from the tests. The GPU machine can: ``cutile-perf compile-check --record`` runs
the session's correctness tests once there with ``CUTILE_PERF_RECORD_LAUNCHES=<file>``, and the
pytest plugin then wraps ``cuda.tile.launch``. Each call's arguments go through cuTile's own
parameter-constraint function, the one its JIT uses. The kernel name and the parameters, in the
spec's words, are appended to the file once per distinct signature. The launch itself is
untouched, and a failure to record never fails a test. Back on the machine without a GPU,
``signature_spec.recorded_spec`` turns the file into ``sandbox/compile-check.yaml``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cutile_perf.kernel.signature_spec import array_text


def spec_value(constraint: Any, arg: Any = None) -> Any:
    """One parameter in the spec's words: ``float16(4096x1024)`` (an array passed as a contiguous
    tensor: its shape, from which compile-check derives the same constraint), ``float16[2]`` (any
    other array: its rank), ``float32`` (scalar) or the constant."""
    kind = type(constraint).__name__
    if kind == "ArrayConstraint":
        shape = tuple(int(d) for d in getattr(arg, "shape", None) or ())
        contiguous = getattr(arg, "is_contiguous", None)
        by_shape = len(shape) == constraint.ndim and callable(contiguous) and contiguous() and all(d > 0 for d in shape)
        return array_text(str(constraint.dtype), constraint.ndim, shape if by_shape else None)
    if kind == "ScalarConstraint":
        return str(constraint.dtype)
    if kind == "ConstantConstraint":
        return constraint.value
    raise TypeError(f"unknown parameter constraint {kind}")


def describe(kernel, constraints, args=None) -> tuple[str, dict[str, Any]]:
    """``(kernel name, {parameter: spec value})`` for one launch; with ``args`` (the launch's
    arguments), contiguous tensors are described by their shape."""
    from cutile_perf.kernel.compilecheck import kernel_params  # noqa: PLC0415 - needs cuda.tile

    names = [name for name, _ in kernel_params(kernel)]
    args = list(args) if args is not None else [None] * len(constraints)
    return kernel._annotated_function.pyfunc.__name__, dict(zip(names, (spec_value(c, a)
                                                                       for c, a in zip(constraints, args))))


def install(path: Path) -> None:
    """Wrap ``cuda.tile.launch`` so that each distinct signature is appended to ``path``."""
    import cuda.tile as ct  # noqa: PLC0415 - only in a run that asked for it
    from cuda.tile._cext import get_parameter_constraints_from_pyargs  # noqa: PLC0415 - cuda-tile 1.7
    from cuda.tile.compilation import CallingConvention  # noqa: PLC0415

    real_launch = ct.launch
    seen: set[str] = set()

    def launch(stream, grid, kernel, kernel_args, /, **kwargs):
        try:
            constraints = get_parameter_constraints_from_pyargs(kernel, tuple(kernel_args),
                                                                CallingConvention.cutile_python_v1())
            # One line per distinct signature (its constraints: what the JIT compiles one kernel
            # for), written with the first launch's shapes: another shape with the same
            # constraints compiles the same code.
            key = f"{kernel._annotated_function.pyfunc.__name__}:{constraints!r}"
            if key not in seen:
                seen.add(key)
                name, params = describe(kernel, constraints, kernel_args)
                with open(path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"kernel": name, "params": params}) + "\n")  # the kernel's parameter order
        except Exception:  # noqa: BLE001 - recording is a side job: the test's launch must run as it would
            pass
        return real_launch(stream, grid, kernel, kernel_args, **kwargs)

    ct.launch = launch


def read(path: Path) -> dict[str, list[dict[str, Any]]]:
    """{kernel: [params, ...]} from a recorded file, each distinct signature once, in first-seen order."""
    found: dict[str, list[dict[str, Any]]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("params"), dict):
            sigs = found.setdefault(str(row.get("kernel")), [])
            if row["params"] not in sigs:
                sigs.append(row["params"])
    return found
