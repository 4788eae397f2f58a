"""Candidates of our own for TileGym ops, made from the op's file at run time (issue 41 items 1 and 4):
each one sets the entry hints of every ``@ct.kernel`` in the module (``references/knobs.md``) and
changes nothing else, so no TileGym code is kept in this repository.

    python benchmarks/tilegym_candidates.py TILEGYM --ops silu_and_mul,rms_norm,swiglu --out CANDS

writes ``CANDS/<op>/<name>.py`` (whole modules, as ``screen`` and ``tilegym_campaign.py`` take them),
one per entry of ``HINT_SETS`` that changes the file; ``--most N`` keeps the first N. The op's file
is ``src/tilegym/ops/cutile/<op>.py``. Exit 2, with one line, when an op has no such file or no
kernel. What they make faster or slower is for the GPU run to say: hints the compiler may ignore
(``num_ctas`` on a kernel that uses no cluster) leave a candidate that measures as the base.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

OPS_DIR = Path("src/tilegym/ops/cutile")

# Occupancy (CTAs per SM) from 1 to 16, clusters of 2 and 4, and both: eight candidates per op.
HINT_SETS: tuple[dict[str, int], ...] = (
    {"occupancy": 1}, {"occupancy": 2}, {"occupancy": 4}, {"occupancy": 8}, {"occupancy": 16},
    {"num_ctas": 2}, {"num_ctas": 4}, {"occupancy": 2, "num_ctas": 2},
)


def kernel_decorators(tree: ast.Module) -> list[ast.expr]:
    """Every ``@ct.kernel`` and ``@ct.kernel(...)`` decorator in the module, in source order."""
    def is_kernel(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "kernel" and isinstance(node.value, ast.Name)
                and node.value.id == "ct")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [d for d in node.decorator_list
                      if is_kernel(d) or (isinstance(d, ast.Call) and is_kernel(d.func) and not d.args)]
    return sorted(found, key=lambda d: d.lineno)


def with_hints(source: str, hints: dict[str, int]) -> str:
    """``source`` with ``hints`` set on every kernel decorator (kept keywords first, in their order;
    a hint it already had takes the new value). Each decorator becomes one line."""
    lines = source.splitlines(keepends=True)
    for deco in reversed(kernel_decorators(ast.parse(source))):
        kept = {k.arg: ast.unparse(k.value) for k in getattr(deco, "keywords", ()) if k.arg}
        kept.update({name: str(value) for name, value in hints.items()})
        indent = lines[deco.lineno - 1][:deco.col_offset - 1]
        call = ", ".join(f"{name}={value}" for name, value in kept.items())
        lines[deco.lineno - 1:deco.end_lineno] = [f"{indent}@ct.kernel({call})\n"]
    return "".join(lines)


def candidate_name(hints: dict[str, int]) -> str:
    return "_".join(f"{name}{value}" for name, value in hints.items())


def candidates(source: str, most: int | None = None) -> dict[str, str]:
    """``{name: module text}``: one per hint set that changes ``source``, at most ``most``."""
    out = {}
    for hints in HINT_SETS:
        text = with_hints(source, hints)
        if text != source and text not in out.values():
            out[candidate_name(hints)] = text
    return dict(list(out.items())[:most])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tilegym", type=Path)
    p.add_argument("--ops", required=True, help="comma-separated op names (files under src/tilegym/ops/cutile/)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--most", type=int, default=None, help="at most this many candidates per op")
    args = p.parse_args(argv)
    for op in filter(None, (o.strip() for o in args.ops.split(","))):
        path = args.tilegym / OPS_DIR / f"{op}.py"
        if not path.is_file():
            print(f"tilegym_candidates: {path} is not a file", file=sys.stderr)
            return 2
        source = path.read_text(encoding="utf-8")
        if not kernel_decorators(ast.parse(source)):
            print(f"tilegym_candidates: {path} has no @ct.kernel", file=sys.stderr)
            return 2
        made = candidates(source, args.most)
        folder = args.out / op
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in made.items():
            (folder / f"{name}.py").write_text(text, encoding="utf-8")
        print(f"{op}: {len(made)} candidates in {folder} ({', '.join(made)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
