"""Classify Triton kernels for the TileIR backend: dot-related, norm-like, reduction or element-wise,
with the evidence, the advice, and the patterns that are risky under TileIR's memory model.

Pure rules over ``scan.Kernel``; the order of the rules is the decision tree of the skill:
``tl.dot`` first, then reduction + normalisation, then reduction, else element-wise.
"""
from __future__ import annotations

from typing import Any

from cutile_perf.tileir import configs, scan

DOT_OPS = {"dot", "dot_scaled"}
REDUCTION_OPS = {"sum", "max", "min", "argmax", "argmin", "reduce", "cumsum", "cumprod", "associative_scan",
                 "xor_sum", "histogram"}
DESCRIPTOR_OPS = {"make_tensor_descriptor", "load_tensor_descriptor", "store_tensor_descriptor"}
NORM_NAME_HINTS = ("norm", "softmax")
GATE_ADVICE = ("add TileIR-only configs only when triton.runtime.driver.active.get_current_target().backend == "
               "'tileir' (standard triton rejects 'occupancy'); never gate on compute capability, and keep the "
               "original configs")


def _norm_evidence(kernel: scan.Kernel, reductions: set[str]) -> list[str]:
    ops = kernel.ops
    evidence = []
    if reductions and ("rsqrt" in ops or "sqrt" in ops or "sqrt_rn" in ops):
        evidence.append("square root of a reduced value (layer/RMS norm)")
    if {"exp", "exp2"} & set(ops) and "max" in reductions and "sum" in reductions:
        evidence.append("max, exp and sum together (softmax)")
    if kernel.divided_by_reduction:
        evidence.append("division by a reduced value (normalisation)")
    return evidence


def _risks(kernel: scan.Kernel) -> list[dict[str, str]]:
    ops = kernel.ops
    atomics = sorted(op for op in ops if op.startswith("atomic_"))
    risks = []
    split_k_param = next((p for p in kernel.params if "split_k" in p.lower() or "splitk" in p.lower()), None)
    if atomics:
        risks.append({"pattern": "atomics", "detail": ", ".join(f"tl.{a}" for a in atomics),
                      "why": "TileIR orders global memory accesses less strictly than PTX; check results with "
                             "ENABLE_TILE=1 (bf16 atomics were unsupported in early releases)"})
    if (DOT_OPS & set(ops) and atomics) or split_k_param:
        risks.append({"pattern": "split-K cross-block reduction",
                      "detail": f"parameter {split_k_param}" if split_k_param else "tl.dot partial sums combined "
                                                                                  "with atomics",
                      "why": "cross-block communication can give wrong results under TileIR's unordered "
                             "memory model; verify or use a separate reduction kernel"})
    if kernel.autotune is not None:
        protected = set(kernel.autotune.reset_to_zero) | set(kernel.autotune.restore_value)
        for name in sorted(kernel.atomic_params - protected):
            risks.append({"pattern": "atomic output not reset by autotune",
                          "detail": f"tl.atomic_* into {name}, which reset_to_zero does not list",
                          "why": "the autotuner times each config by running it several times on the same "
                                 "arguments, so atomically accumulated outputs add up across runs; list the "
                                 f"argument in @triton.autotune(reset_to_zero=[{name!r}]). The gated TileIR "
                                 "configs turn a one-config autotune into a timed one, so this also bites "
                                 "after --apply-optimizations"})
    if {"atomic_cas", "atomic_xchg"} & set(ops):
        risks.append({"pattern": "lock or spin-wait", "detail": "tl.atomic_cas / tl.atomic_xchg",
                      "why": "locks between blocks rely on memory ordering that TileIR does not guarantee"})
    for name in sorted(kernel.loaded_params & kernel.stored_params):
        risks.append({"pattern": "aliasing", "detail": f"loads and stores through {name}",
                      "why": "in-place updates need TileIR's memory tokens "
                             "(TILEIR_ENABLE_AUTOGEN_ALIAS_MEM_TOKEN, on by default); verify results"})
    if "inline_asm_elementwise" in ops:
        risks.append({"pattern": "inline asm", "detail": "tl.inline_asm_elementwise",
                      "why": "PTX inline assembly is not supported by the TileIR backend"})
    if "make_block_ptr" in ops or "advance" in ops:
        risks.append({"pattern": "make_block_ptr", "detail": "tl.make_block_ptr / tl.advance",
                      "why": "block pointers are restricted on TileIR; prefer tensor descriptors"})
    for op in sorted({"histogram", "dot_scaled"} & set(ops)):
        risks.append({"pattern": f"tl.{op}", "detail": f"tl.{op}",
                      "why": "not supported by some TileIR releases (13.2 lists it as unsupported)"})
    if kernel.uses_occupancy:
        risks.append({"pattern": "occupancy in configs", "detail": "a config sets occupancy",
                      "why": "standard triton raises KeyError/TypeError on it; it must be added only when the "
                             "active backend is tileir"})
    return risks


def classify_kernel(kernel: scan.Kernel) -> dict[str, Any]:
    """One kernel's type, confidence, indicators, recommendations and risks."""
    ops = kernel.ops
    reductions = (REDUCTION_OPS & set(ops)) | set(kernel.method_reductions)
    atomics = sorted(op for op in ops if op.startswith("atomic_"))
    indicators: list[str] = []
    name_hint = next((h for h in NORM_NAME_HINTS if h in kernel.name.lower()), None)

    if DOT_OPS & set(ops):
        kind, confidence = "dot-related", 0.95
        indicators.append("calls " + ", ".join(f"tl.{op} x{ops[op]}" for op in sorted(DOT_OPS & set(ops))))
        if {"exp", "exp2"} & set(ops) and "max" in reductions:
            indicators.append("exp and max beside the dot (attention-like)")
    elif reductions or atomics:
        evidence = _norm_evidence(kernel, reductions)
        indicators.append("reduces with " + ", ".join(sorted(reductions or set(atomics))))
        if evidence:
            kind = "norm-like"
            confidence = 0.9 if len(evidence) > 1 or name_hint else 0.8
            indicators.extend(evidence)
        elif name_hint:
            kind, confidence = "norm-like", 0.6
        else:
            kind = "reduction"
            confidence = 0.85 if reductions else 0.7
            if not reductions:
                indicators.append("partial results combined across blocks with atomics")
        if name_hint:
            indicators.append(f"kernel name contains '{name_hint}'")
    else:
        kind = "element-wise"
        has_io = "load" in ops and "store" in ops
        confidence = 0.9 if has_io else 0.6
        indicators.append("loads and stores with no reduction or dot" if has_io else "no reduction or dot found")
    return {
        "name": kernel.name,
        "line": kernel.lineno,
        "classification": kind,
        "confidence": confidence,
        "strategy": configs.VARIANTS[kind].strategy,
        "indicators": indicators,
        "recommendations": _recommendations(kernel, kind),
        "risks": _risks(kernel),
        "autotune": None if kernel.autotune is None else {
            "config_count": kernel.autotune.literal_config_count, "key": kernel.autotune.key,
            "reset_to_zero": kernel.autotune.reset_to_zero, "restore_value": kernel.autotune.restore_value},
        "ops": dict(sorted(ops.items())),
    }


def _recommendations(kernel: scan.Kernel, kind: str) -> list[str]:
    ops = kernel.ops
    advice = [f"TileIR configs for a {kind} kernel: {configs.describe(kind)}", GATE_ADVICE]
    if kind == "dot-related" and "load" in ops and not DESCRIPTOR_OPS & set(ops):
        advice.append("tiles are loaded through pointers: move them to tensor descriptors (tl.make_tensor_descriptor, "
                      "or a host TensorDescriptor with a pre_hook that sets block_shape) so tileiras can use TMA; "
                      "this rewrite is manual")
    if kind == "dot-related":
        advice.append("num_ctas=2 means 2-CTA MMA on Blackwell only; elsewhere it is a thread-block cluster")
    if kind in {"norm-like", "reduction"}:
        advice.append("no TMA needed; do not over-tune num_warps (a hint at most under TileIR)")
    if {"exp", "exp2", "log", "log2"} & set(ops):
        advice.append("exp/log-heavy: try TILEIR_ENABLE_APPROX=1 and TILEIR_ENABLE_FTZ=1 under TileIR, then "
                      "re-verify accuracy")
    if kernel.autotune is None:
        advice.append("no @triton.autotune: configs cannot be added without changing the launch site; wrap the "
                      "kernel in @triton.autotune with a gated config list by hand")
    return advice


_PRIORITY = {"dot-related": 0, "norm-like": 1, "reduction": 2, "element-wise": 3}


def classify_source(source: str) -> dict[str, Any]:
    """The JSON of ``classify-triton``: the main kernel's fields at top level, every kernel in ``kernels``."""
    module = scan.scan(source)
    kernels = [classify_kernel(k) for k in module.kernels]
    if not kernels:
        return {"classification": None, "confidence": 0.0, "indicators": ["no @triton.jit function found"],
                "recommendations": ["pass a module that defines a @triton.jit kernel"], "risks": [], "kernels": []}
    # The kernel that decides the strategy: the highest-priority type, first in the file on ties.
    main = min(kernels, key=lambda k: _PRIORITY[k["classification"]])
    return {
        "kernel": main["name"],
        "classification": main["classification"],
        "confidence": main["confidence"],
        "strategy": main["strategy"],
        "indicators": main["indicators"],
        "recommendations": main["recommendations"],
        "risks": [dict(r, kernel=k["name"]) for k in kernels for r in k["risks"]],
        "kernels": kernels,
    }
