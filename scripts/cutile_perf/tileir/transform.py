"""``--apply-optimizations``: add TileIR configs beside a kernel's own, behind a backend gate.

Each ``@triton.autotune(configs=EXPR)`` becomes ``configs=_cutile_perf_with_tileir_configs(EXPR, KIND)``.
The inserted helper returns ``EXPR`` itself (the same object) unless the active Triton target is
``tileir`` when the module is imported; only then does it append variants of the original configs
with ``occupancy`` (and ``num_ctas``/tiles for dot kernels). Standard triton raises on ``occupancy``,
so on it the configs must not merely be "ignored" — they must not be there at all.

The edit is textual at the AST's offsets, so the user's formatting and comments survive.
"""
from __future__ import annotations

import ast
from typing import Any

from cutile_perf.tileir import configs, scan

MARKER = scan.GATE_HELPER

_HELPER = '''

# --- added by `cutile-perf classify-triton --apply-optimizations` -------------------------------
# TileIR-only configs (occupancy, num_ctas=2, larger tiles) are appended to a kernel's own configs
# only when the active Triton target is the TileIR backend at import time. Standard triton rejects
# the `occupancy` field, so there the config lists stay exactly as written.
_CUTILE_PERF_TILEIR_VARIANTS = {variants}


def _cutile_perf_tileir_active():
    try:
        from triton.runtime import driver

        return driver.active.get_current_target().backend == "tileir"
    except Exception:  # no GPU, no active driver (CPU interpreter), or a triton without this API
        return False


def _cutile_perf_block_key(kwargs, axis):
    for key in kwargs:
        name = key.upper().replace("_SIZE", "").replace("_", "")
        if name == "BLOCK" + axis:
            return key
    return None


def {marker}(configs, kind):
    """`configs` itself unless the TileIR backend is active; then `configs` plus TileIR variants."""
    if not _cutile_perf_tileir_active():
        return configs
    import itertools

    import triton

    spec = _CUTILE_PERF_TILEIR_VARIANTS[kind]
    originals = list(configs) or [triton.Config({{}})]
    bases, seen_kwargs = [], []
    for config in originals:
        kwargs = {{k: v for k, v in config.kwargs.items() if k != "occupancy"}}
        if kwargs not in seen_kwargs:
            seen_kwargs.append(kwargs)
            bases.append((kwargs, config))
    first_kwargs, first = bases[0]
    m_key, n_key = _cutile_perf_block_key(first_kwargs, "M"), _cutile_perf_block_key(first_kwargs, "N")
    if m_key and n_key:
        for m, n in spec["larger_tiles"]:
            bases.append(({{**first_kwargs, m_key: m, n_key: n}}, first))
    added, seen = [], set()
    for kwargs, config in bases:
        for occupancy, stages, warps, ctas in itertools.product(
                spec["occupancy"], spec["num_stages"] or [config.num_stages],
                spec["num_warps"] or [config.num_warps], spec["num_ctas"] or [config.num_ctas]):
            key = (tuple(sorted(kwargs.items())), occupancy, stages, warps, ctas)
            if key in seen or len(added) >= spec["cap"]:
                continue
            seen.add(key)
            added.append(triton.Config({{**kwargs, "occupancy": occupancy}}, num_warps=warps, num_stages=stages,
                                       num_ctas=ctas, maxnreg=config.maxnreg, pre_hook=config.pre_hook))
    return list(configs) + added
# --- end of cutile-perf addition -----------------------------------------------------------------
'''


def _variants_literal(kinds: list[str]) -> str:
    table = {}
    for kind in kinds:
        v = configs.VARIANTS[kind]
        table[kind] = {"occupancy": list(v.occupancy), "num_stages": list(v.num_stages) if v.num_stages else None,
                       "num_warps": list(v.num_warps) if v.num_warps else None,
                       "num_ctas": list(v.num_ctas) if v.num_ctas else None,
                       "larger_tiles": [list(t) for t in v.larger_tiles], "cap": v.cap}
    return repr(table)


def _offset(lines: list[str], lineno: int, col: int) -> int:
    """Absolute character offset of an AST (1-based line, UTF-8 byte column) position."""
    line = lines[lineno - 1]
    return sum(len(x) for x in lines[: lineno - 1]) + len(line.encode("utf-8")[:col].decode("utf-8"))


def _helper_insert_offset(tree: ast.Module, lines: list[str]) -> int:
    """After the module docstring and the leading imports (the helper needs none of the user's names)."""
    after = None
    for i, node in enumerate(tree.body):
        is_doc = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if is_doc or is_future or isinstance(node, (ast.Import, ast.ImportFrom)):
            after = node
            continue
        break
    if after is None:
        return 0
    return sum(len(x) for x in lines[: after.end_lineno])


def apply_optimizations(source: str, classification: dict[str, Any]) -> dict[str, Any]:
    """``optimized_code`` and ``changes_applied`` for ``source``, given ``classify_source``'s result."""
    if MARKER in source:
        return {"optimized_code": source, "changes_applied": [],
                "skipped": ["TileIR configs were already added by cutile-perf; nothing to do"]}
    module = scan.scan(source)
    kinds = {k["name"]: k["classification"] for k in classification["kernels"]}
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    changes: list[str] = []
    skipped: list[str] = []
    used_kinds: list[str] = []
    for kernel in module.kernels:
        kind = kinds[kernel.name]
        node = kernel.autotune.configs_node if kernel.autotune else None
        if node is None:
            skipped.append(f"{kernel.name}: no @triton.autotune configs to extend (launch passes its meta-"
                           "parameters); add a gated autotune by hand if wanted")
            continue
        start = _offset(lines, node.lineno, node.col_offset)
        end = _offset(lines, node.end_lineno, node.end_col_offset)
        edits.append((start, end, f"{MARKER}({source[start:end]}, {kind!r})"))
        if kind not in used_kinds:
            used_kinds.append(kind)
        count = kernel.autotune.literal_config_count
        originals = f"its {count} original config(s)" if count is not None else "its original configs"
        changes.append(f"{kernel.name} ({kind}): TileIR configs added beside {originals}: "
                       f"{configs.describe(kind)}, only when the active Triton backend is tileir")
    if not edits:
        return {"optimized_code": source, "changes_applied": [], "skipped": skipped}
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    at = _helper_insert_offset(module.tree, lines)
    helper = _HELPER.format(variants=_variants_literal(used_kinds), marker=MARKER)
    out = out[:at] + helper + out[at:]
    changes.insert(0, f"inserted the backend gate {MARKER}() (returns the original configs unless "
                      "triton.runtime.driver.active.get_current_target().backend == 'tileir')")
    ast.parse(out)  # a transformation that breaks the module is a bug of ours; fail loudly here
    return {"optimized_code": out, "changes_applied": changes, "skipped": skipped}
