"""A warp per row for RMSNorm and LayerNorm at 262144x1024 fp16, against torch.compile (GPU; tileiras 13.5).

Playbook entry P: Inductor runs these two norms as 262144 CTAs of one warp each and stays 1-3 %
ahead of our best steps (8 rows per 4-warp CTA). cuTile asks for fewer than 4 worker warps with
``num_worker_warps=1`` or ``2``, which needs TileIR bytecode 13.5. cuda-tile 1.7.0 (the newest on
PyPI when this was written) writes bytecode 13.4 at most, whatever tileiras is installed: its
``_compile._SUPPORTED_VERSIONS`` stops at 13.4, and ``dev_features_enabled()`` (which would allow
13.5) is compiled to ``False`` in the release wheel. So this script, and only this script, appends
13.5 to that private list before compiling anything, when ``tileiras --version`` says 13.5 or later
(printed on stderr), in the main process and in each precompile worker; every kernel compiled here,
the shipped best steps included, is then emitted as bytecode 13.5. With tileiras 13.4, or with
``--cuda-tile-alone``, it leaves cuda-tile alone and the warp configs fail to compile.

For each of 3 rounds (medians of 3, all in one process): the copy ceiling, torch.compile of the
reference, the shipped best step (``best:`` of steps.yaml, loaded from its file) and every warp
config below, each correctness-checked against the reference first (``benchmarks/kernels.py``'s
check) and timed by ``cutile_perf.bench`` (cold L2, CUDA events, median of the samples).

Usage:
  python benchmarks/warp_per_row.py --precompile 8 --rounds 3     # GPU
  python benchmarks/warp_per_row.py --compile-only                 # CPU: AOT-compile every config for sm_90
  python benchmarks/warp_per_row.py --compile-only --cuda-tile-alone   # what cuda-tile 1.7.0 does by itself
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels as kb  # noqa: E402  (benchmarks/kernels.py: cases, inputs, references, timing, step loading)

import cuda.tile as ct  # noqa: E402
import torch  # noqa: E402

from tilesuite.ops.cutile._host import as_rows, current_stream, next_power_of_2  # noqa: E402

ZERO = ct.PaddingMode.ZERO


def tileiras_release() -> tuple[int, int] | None:
    """(major, minor) of the tileiras cuda-tile will run, from its --version; None if not found."""
    from cuda.tile._compile import _find_compiler_bin  # private: the binary cuda-tile itself picks

    try:
        text = subprocess.run([_find_compiler_bin().path, "--version"], capture_output=True, text=True).stdout
    except Exception:
        return None
    m = re.search(r"release (\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def enable_bytecode_13_5() -> str:
    """Let cuda-tile 1.7.0 emit TileIR bytecode 13.5 when tileiras is 13.5+ (see the module docstring)."""
    import cuda.tile._compile as compile_mod
    from cuda.tile._bytecode.version import BytecodeVersion

    release = tileiras_release()
    if release is None or release < (13, 5):
        found = "not found" if release is None else f"{release[0]}.{release[1]}"
        return f"tileiras {found}: bytecode left at cuda-tile's maximum (13.4)"
    if not hasattr(BytecodeVersion, "V_13_5"):
        return "this cuda-tile has no bytecode 13.5 encoder"
    if BytecodeVersion.V_13_5 not in compile_mod._SUPPORTED_VERSIONS:
        compile_mod._SUPPORTED_VERSIONS.append(BytecodeVersion.V_13_5)
    return f"tileiras {release[0]}.{release[1]}: cuda-tile allowed to emit bytecode 13.5 (private _SUPPORTED_VERSIONS)"




@ct.kernel
def rms_norm_warp_kernel(x, weight, out, eps: float, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int],
                         LOAD_TMA: ct.Constant[bool]):
    """rms_norm step 05's body (LOAD_TMA=False: every load from registers, not only the store); the launch layout (worker warps, rows per CTA, occupancy) is the config's."""
    n = x.shape[1]
    block = ct.bid(0)
    xr = ct.astype(ct.load(x, (block, 0), (TILE_M, TILE_N), padding_mode=ZERO, allow_tma=LOAD_TMA), ct.float32)
    w = ct.reshape(ct.astype(ct.load(weight, (0,), (TILE_N,), padding_mode=ZERO, allow_tma=LOAD_TMA), ct.float32),
                   (1, TILE_N))
    rstd = ct.rsqrt(ct.sum(xr * xr, axis=1, keepdims=True) / n + eps)
    ct.store(out, (block, 0), ct.astype(xr * rstd * w, out.dtype), allow_tma=False)


@ct.kernel
def layer_norm_warp_kernel(x, weight, bias, out, eps: float, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int],
                           LOAD_TMA: ct.Constant[bool]):
    """layer_norm step 11's body (1/n, rsqrt ftz, affine as two FMAs); layout from the config."""
    inv_n = 1.0 / x.shape[1]
    w = ct.reshape(ct.astype(ct.load(weight, (0,), (TILE_N,), padding_mode=ZERO, allow_tma=LOAD_TMA), ct.float32),
                   (1, TILE_N))
    b = ct.reshape(ct.astype(ct.load(bias, (0,), (TILE_N,), padding_mode=ZERO, allow_tma=LOAD_TMA), ct.float32),
                   (1, TILE_N))
    block = ct.bid(0)
    t = ct.astype(ct.load(x, (block, 0), (TILE_M, TILE_N), padding_mode=ZERO, latency=10, allow_tma=LOAD_TMA),
                  ct.float32)
    mean = ct.sum(t, axis=1, keepdims=True) * inv_n
    var = ct.maximum(ct.sum(t * t, axis=1, keepdims=True) * inv_n - mean * mean, 0.0)
    rstd = ct.rsqrt(var + eps, flush_to_zero=True)
    y = (t * rstd - mean * rstd) * w + b
    ct.store(out, (block, 0), ct.astype(y, out.dtype), latency=3, allow_tma=False)


@dataclass(frozen=True)
class WarpConfig:
    warps: int  # num_worker_warps
    rows: int  # rows per CTA
    occupancy: int  # occupancy hint (CTAs per SM the compiler sizes registers for)
    load_tma: bool = False  # False: register loads (LDG), True: TMA

    def label(self) -> str:
        return f"warps={self.warps} rows={self.rows} occ={self.occupancy} load={'tma' if self.load_tma else 'ldg'}"


# Registers from `--compile-only` on a CPU (sm_90, tileiras 13.5, bytecode 13.5, 1024-column fp16 rows):
# with 1 worker warp the occupancy hint 8, 16 or 32 gave the same cubin, so only 16 is timed. LDG
# configs have no stack (rms_norm 1 warp, 1 row: 56 registers); the TMA config spills (64 registers,
# 80 B of stack for rms_norm, 104 B for layer_norm).
CONFIGS = [
    WarpConfig(1, 1, 16),  # a warp per row, Inductor's layout (262144 CTAs of 32 threads)
    WarpConfig(1, 1, 16, load_tma=True),
    WarpConfig(1, 2, 16),
    WarpConfig(2, 2, 16),  # a warp per row, two rows per CTA
    WarpConfig(2, 1, 16),
    WarpConfig(4, 4, 4),  # a warp's worth of threads per row in step 05's 4-warp CTAs (allowed on 13.4 too)
]
OPS = ("rms_norm", "layer_norm")
CASES = [c for c in kb.FULL_CASES if c.module in OPS and c.shape == (262144, 1024)]


def warp_function(op: str, cfg: WarpConfig):
    kernel = (rms_norm_warp_kernel if op == "rms_norm" else layer_norm_warp_kernel).replace_hints(
        num_worker_warps=cfg.warps, occupancy=cfg.occupancy)

    def run(x, *params):
        rows = as_rows(x)
        out = torch.empty_like(rows)
        eps = 1e-6 if op == "rms_norm" else 1e-5
        args = (rows, *[p.contiguous() for p in params], out, eps, cfg.rows, next_power_of_2(rows.shape[1]),
                cfg.load_tma)
        ct.launch(current_stream(), (ct.cdiv(rows.shape[0], cfg.rows),), kernel, args)
        return out.view(x.shape)

    return run


def best_step(case) -> tuple[str, object]:
    label, path = kb.versions(case.module, all_steps=False)[1]
    return f"best step {label}", kb.load_function(case, path)


def _compile_job(job: tuple) -> str:
    """Worker: run one config (or the best step) once on small inputs, so the timed run hits the disk cache."""
    case, cfg, bytecode_13_5 = job
    if bytecode_13_5:
        enable_bytecode_13_5()  # a spawned worker starts with cuda-tile's own list
    try:
        fn = best_step(case)[1] if cfg is None else warp_function(case.module, cfg)
        fn(*kb.make_inputs(kb.small(case)))
        torch.cuda.synchronize()
        return ""
    except Exception as exc:
        return f"{case.kernel} {cfg.label() if cfg else 'best step'}: {kb._error(exc)}"


def compile_only(arch: str) -> int:
    """AOT-compile every config for `arch` without a GPU; prints registers/stack when cuobjdump is there."""
    from cuda.tile.compilation import export_kernel
    import io

    import tempfile

    from cutile_perf.kernel.compile_report import find_cuobjdump, inspect_cubin
    from tilesuite.aot import contiguous, scalar, signature

    cuobjdump = find_cuobjdump()

    failures = 0
    for op in OPS:
        kernel0 = rms_norm_warp_kernel if op == "rms_norm" else layer_norm_warp_kernel
        vecs = 1 if op == "rms_norm" else 2
        params = [contiguous(ct.float16, 2)] + [contiguous(ct.float16, 1)] * vecs + [contiguous(ct.float16, 2),
                                                                                      scalar(ct.float32)]
        for cfg in CONFIGS:
            kernel = kernel0.replace_hints(num_worker_warps=cfg.warps, occupancy=cfg.occupancy)
            try:
                buf = io.BytesIO()
                export_kernel(kernel, [signature(params + [cfg.rows, 1024, cfg.load_tma])], buf, gpu_code=arch,
                              output_format="cubin")
                info = ""
                if cuobjdump is not None:
                    with tempfile.TemporaryDirectory() as tmp:
                        (Path(tmp) / "k.cubin").write_bytes(buf.getvalue())
                        cub = inspect_cubin(Path(tmp) / "k.cubin", cuobjdump)
                    info = f"registers {cub.get('registers')}, stack {cub.get('stack')} B, SASS {cub.get('sass')}"
                print(f"{op:10s} {cfg.label():40s} compiled; {info}")
            except Exception as exc:
                failures += 1
                print(f"{op:10s} {cfg.label():40s} FAILED {kb._error(exc)}")
    return 1 if failures else 0


def one_round(rnd: int, budget: dict, results: dict, fns: dict, inputs: dict, expected: dict) -> float:
    copy = kb.copy_bandwidth_tbps(budget, False)
    results.setdefault(("copy", "TB/s"), []).append(copy)
    print(f"round {rnd}: copy {copy:.3f} TB/s", flush=True)
    for case in CASES:
        for label, fn in fns[case.module]:
            key = (case.module, label)
            try:
                wrong = kb.check_close(fn(*inputs[case.module]), expected[case.module]) if rnd == 1 else ""
            except Exception as exc:
                wrong = kb._error(exc)
            if wrong or key in results.get("_failed", {}):
                results.setdefault("_failed", {})[key] = results.get("_failed", {}).get(key, wrong)
                print(f"round {rnd}: {case.module} {label}: {results['_failed'][key]}", flush=True)
                continue
            ms, note = kb.try_time(lambda: fn(*inputs[case.module]), budget)
            if ms is None:
                results.setdefault("_failed", {})[key] = note
                print(f"round {rnd}: {case.module} {label}: {note}", flush=True)
                continue
            results.setdefault(key, []).append(ms)
            print(f"round {rnd}: {case.module} {label}: {ms:.4f} ms", flush=True)
        torch.cuda.empty_cache()
    return copy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precompile", type=int, default=0, metavar="N")
    parser.add_argument("--compile-only", action="store_true", help="AOT-compile the configs for --arch, no GPU")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--cuda-tile-alone", action="store_true",
                        help="do not let cuda-tile emit bytecode 13.5 (shows what cuda-tile does by itself)")
    args = parser.parse_args(argv)
    bytecode_13_5 = not args.cuda_tile_alone
    note = enable_bytecode_13_5() if bytecode_13_5 else "--cuda-tile-alone: cuda-tile left alone"
    print(note, file=sys.stderr, flush=True)
    if args.compile_only:
        return compile_only(args.arch)
    if not torch.cuda.is_available():
        print("benchmarks/warp_per_row.py needs a CUDA GPU (or --compile-only)", file=sys.stderr)
        return 3
    jobs = [(case, cfg, bytecode_13_5) for case in CASES for cfg in [None, *CONFIGS]]
    for failure in kb.run_pool(_compile_job, jobs, args.precompile):
        if failure:
            print(f"precompile: {failure}", file=sys.stderr, flush=True)
    inputs = {case.module: kb.make_inputs(case) for case in CASES}
    expected = {case.module: kb.torch_reference(case)(*inputs[case.module]) for case in CASES}
    fns = {case.module: [("torch.compile", torch.compile(kb.torch_reference(case))), best_step(case)]
           + [(cfg.label(), warp_function(case.module, cfg)) for cfg in CONFIGS] for case in CASES}
    results: dict = {}
    for rnd in range(1, args.rounds + 1):
        one_round(rnd, {}, results, fns, inputs, expected)
    copy_med = statistics.median(results[("copy", "TB/s")])
    props = torch.cuda.get_device_properties(0)
    print(f"\n{props.name}, torch {torch.__version__}, {note}; {args.rounds} rounds in one process; "
          f"copy median {copy_med:.3f} TB/s (rounds: {', '.join(f'{v:.3f}' for v in results[('copy', 'TB/s')])})\n")
    print("| op 262144x1024 fp16 | version | median ms | rounds ms | % of copy (median) | vs torch.compile |")
    print("|---|---|---|---|---|---|")
    for case in CASES:
        units = kb.work_units(case, inputs[case.module])
        comp = results.get((case.module, "torch.compile"))
        comp_med = statistics.median(comp) if comp else None
        for label, _ in fns[case.module]:
            vals = results.get((case.module, label))
            if not vals:
                print(f"| {case.module} | {label} | n/a | {results.get('_failed', {}).get((case.module, label), '')} | | |")
                continue
            med = statistics.median(vals)
            pct = 100.0 * units / (med * 1e-3) / 1e12 / copy_med
            rel = f"{100.0 * (med / comp_med - 1.0):+.1f} %" if comp_med else "n/a"
            print(f"| {case.module} | {label} | {med:.4f} | {' / '.join(f'{v:.4f}' for v in vals)} | {pct:.1f} % | {rel} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
