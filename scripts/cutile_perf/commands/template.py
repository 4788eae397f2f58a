"""`cutile-perf template autotune`: print (or write) a tune-once / cache / launch module.

Renders ``templates/autotune/<kind>.py.j2`` through ``cutile_perf.tune.codegen.render``. Every
field has a worked default for its kind (an RMSNorm-like kernel for ``occupancy``, a matmul for
``tile_search``, an in-place kernel for ``split_buffer``), so ``--kind`` alone prints a complete
example; the other flags replace the fields for the user's kernel.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from cutile_perf.store import atomic
from cutile_perf.output import Outcome
from cutile_perf.errors import Refused, UsageError
from cutile_perf.tune.codegen import render

NAMES = ("autotune",)

# Names people type for a kernel family, mapped to the template that fits it.
KIND_ALIASES = {
    "norm": "occupancy", "rms_norm": "occupancy", "layer_norm": "occupancy", "softmax": "occupancy",
    "reduction": "occupancy", "elementwise": "occupancy", "swiglu": "occupancy", "persistent": "occupancy",
    "matmul": "tile_search", "gemm": "tile_search", "attention": "tile_search", "fmha": "tile_search",
    "inplace": "split_buffer", "in_place": "split_buffer",
}

_OCCUPANCY = [{"occupancy": o} for o in (1, 2, 4, 8)]
EXAMPLES: dict[str, dict[str, Any]] = {
    "occupancy": dict(
        op_name="rms_norm", kernel_module="mypkg.ops.cutile.rms_norm", kernel_name="rms_norm_kernel",
        params=["x", "weight", "out", "eps", "tile_n"], grid="(x.shape[0],)",
        args="(x, weight, out, eps, tile_n)", key="(tuple(x.shape), x.dtype, str(x.device))",
        configs=_OCCUPANCY, fixed={"occupancy": 1}, inplace=[]),
    "tile_search": dict(
        op_name="matmul", kernel_module="mypkg.ops.cutile.matmul", kernel_name="matmul_kernel",
        params=["a", "b", "c"],
        grid="(-(-a.shape[0] // cfg.TILE_M) * -(-b.shape[1] // cfg.TILE_N), 1, 1)",
        args="(a, b, c, cfg.TILE_M, cfg.TILE_N, cfg.TILE_K)",
        key="(tuple(a.shape), tuple(b.shape), a.dtype, str(a.device))",
        configs=[{"TILE_M": m, "TILE_N": n, "TILE_K": 64, "occupancy": o, "num_ctas": 1}
                 for m, n in ((128, 128), (128, 256), (64, 128)) for o in (1, 2)],
        fixed={"TILE_M": 128, "TILE_N": 128, "TILE_K": 64, "occupancy": 1, "num_ctas": 1}, inplace=[]),
    "split_buffer": dict(
        op_name="rope", kernel_module="mypkg.ops.cutile.rope", kernel_name="rope_kernel",
        params=["q", "cos", "sin"], grid="(q.shape[0],)", args="(q, cos, sin)",
        key="(tuple(q.shape), q.dtype, str(q.device))", configs=_OCCUPANCY, fixed={"occupancy": 1},
        inplace=["q"]),
}
KINDS = tuple(EXAMPLES)
# Fields given as Python expressions: each must parse on its own.
EXPRESSIONS = ("grid", "args", "key")


def resolve_kind(kind: str) -> str:
    key = kind.strip().lower().replace("-", "_")
    resolved = KIND_ALIASES.get(key, key)
    if resolved not in EXAMPLES:
        raise UsageError(f"--kind {kind!r}: unknown", f"choose one of: {', '.join([*KINDS, *sorted(KIND_ALIASES)])}")
    return resolved


def _names(text: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise UsageError(f"{flag}: not Python names: {', '.join(bad)}")
    return names


def _json(text: str, flag: str):
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: not valid JSON ({exc})") from None


def _expression(text: str, flag: str) -> None:
    try:
        ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte
        raise UsageError(f"{flag} {text!r}: not a Python expression ({getattr(exc, 'msg', exc)})") from None


def template(*, name: str, kind: str, overrides: dict[str, str | None], output: Path | None) -> Outcome:
    """``overrides`` maps render fields to the flag text given (None: keep the example's value)."""
    if name not in NAMES:
        raise UsageError(f"unknown template {name!r}; available: {', '.join(NAMES)}")
    resolved = resolve_kind(kind)
    fields = dict(EXAMPLES[resolved])
    for key, text in overrides.items():
        if text is None:
            continue
        if key in ("params", "inplace"):
            fields[key] = _names(text, f"--{key}")
        elif key in ("configs", "fixed"):
            fields[key] = _json(text, f"--{key}")
        else:
            fields[key] = text
    if overrides.get("configs") is not None and overrides.get("fixed") is None:
        fields["fixed"] = fields["configs"][0] if isinstance(fields["configs"], list) and fields["configs"] else {}

    for key, flag in (("op_name", "--op"), ("kernel_name", "--kernel-name"), ("kernel_module", "--kernel-module")):
        text = str(fields[key])
        dotted = key == "kernel_module"
        if overrides.get(key) is not None and not all(p.isidentifier() for p in (text.split(".") if dotted else [text])):
            raise UsageError(f"{flag} {text!r}: not a Python {'module path' if dotted else 'name'}")
    for key in EXPRESSIONS:
        if overrides.get(key) is not None:
            _expression(fields[key], f"--{key}")
    source = render(resolved, **fields)
    try:
        ast.parse(source)
    except (SyntaxError, ValueError) as exc:  # never write (or print) Python that does not parse
        raise UsageError(f"the generated module does not parse (line {exc.lineno}: {exc.msg})",
                         "check --grid, --args, --key, --op and --kernel-module") from None
    data = {"kind": resolved, "fields": fields}
    if output is None:
        return Outcome(source.rstrip("\n"), {**data, "source": source})
    output = Path(output)
    if output.exists():
        raise Refused(f"{output} exists; refusing to overwrite it", "pass --output <new file>, or remove it first")
    atomic.write_text(output, source)
    return Outcome(f"wrote the {resolved} tune-once/cache/launch module for {fields['kernel_name']} to {output}",
                   {**data, "output": str(output)})
