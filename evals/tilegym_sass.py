"""SASS of a TileGym kernel file for the exact signatures the GPU's JIT compiled (CPU only).

    python evals/tilegym_sass.py --kernel evals/fixtures/tilegym/dropout/faster2.py \\
        --as src/tilegym/ops/cutile/dropout.py [--tilegym .tilegym] [--dump DIR] MANGLED_NAME ...

MANGLED_NAME: a cuTile kernel symbol as TileGym's perf records name it (``kernel_name`` in a
``records.jsonl`` of evals/results/*/logs.tar.gz), e.g.
``_dropout_kernel_Kt1_A1f16_1i16t1_p16_A1f16_1i16t1_p16_F3fe0000000000000_I0_I8192_B1_I1073741823``.
Its signature (dtypes, shapes divisible by 16, strides, constants) is demangled and compiled for
sm_90; to check a candidate with other constants, edit the trailing ``_I<int>`` / ``_B<0|1>``
parts. Prints per signature: registers, stack, LDG/STG widths, instructions (NOPs left out) and
the BRA / BSSY counts (a bounds-checked tiled load wrapped in branch regions shows as BSSY).
``cutile-perf compile-check --spec`` cannot say "shapes divisible by 16", which is what the JIT
specializes on for these shapes; this can.
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from cutile_perf.kernel import compilecheck as cc  # noqa: E402
from cutile_perf.kernel.compile_report import find_cuobjdump, inspect_cubin  # noqa: E402

_INSTR = re.compile(r"\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def sass_summary(sass: str) -> dict:
    ops = collections.Counter(m.group(2).split(".")[0] for m in map(_INSTR.match, sass.splitlines()) if m)
    ops.pop("NOP", None)
    return {"instructions": sum(ops.values()), "BRA": ops["BRA"], "BSSY": ops["BSSY"], "MUFU": ops["MUFU"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python evals/tilegym_sass.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", type=Path, required=True, help="kernel file (e.g. a fixture's faster2.py)")
    p.add_argument("--as", dest="as_", help="the TileGym file it replaces, e.g. src/tilegym/ops/cutile/dropout.py")
    p.add_argument("--tilegym", type=Path, default=ROOT / ".tilegym", help="TileGym checkout (default .tilegym)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--dump", type=Path, help="write each signature's SASS here")
    p.add_argument("names", nargs="+", metavar="MANGLED_NAME")
    a = p.parse_args(argv)
    from cuda.tile.compilation._name_mangling import demangle_kernel_name  # private, cuda-tile 1.7

    repo = a.tilegym.resolve()
    module = cc.import_kernel_module(repo, a.kernel.resolve(), (repo / a.as_) if a.as_ else None)
    kernels = cc.kernels_in(module)
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        print("error: cuobjdump not found", file=sys.stderr)
        return 3
    for i, mangled in enumerate(a.names):
        name, signature = demangle_kernel_name(mangled)
        if name not in kernels:
            print(f"error: {name} is not a kernel of {a.kernel}", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="tilegym-sass-") as tmp:
            cubin, _ = cc.compile_signature(kernels[name], signature, a.arch, Path(tmp))
            path = Path(tmp) / "kernel.cubin"
            path.write_bytes(cubin)
            info = inspect_cubin(path, cuobjdump)
            sass = subprocess.run([str(cuobjdump), "-sass", str(path)], capture_output=True, text=True).stdout
        constants = [c.value for c in signature.parameters if hasattr(c, "value")]
        summary = sass_summary(sass)
        print(f"{name} {constants}: registers {info.get('registers')}, stack {info.get('stack')}, "
              f"SASS {info.get('sass')}, {summary['instructions']} instructions, BRA {summary['BRA']}, "
              f"BSSY {summary['BSSY']}, MUFU {summary['MUFU']}")
        if a.dump:
            a.dump.mkdir(parents=True, exist_ok=True)
            (a.dump / f"{i:02d}-{name}.sass").write_text(sass, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
