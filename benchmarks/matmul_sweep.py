"""Sweep the launch and code knobs of the bundled matmul on a GPU, side by side with cuBLAS in one run.

Issue 22, item 4a: the best prepared step of the time (``examples/kernels/optimizations/matmul/03-occupancy-2.py``:
128x128x64 tiles, grouped order GROUP_M=8, occupancy 2) reached 92.0 % of cuBLAS at 4096^3 bf16 and
96.8 % at 8192^3 on the H200; the goal is >= 95 % on both. This sweep's best config became step 07
(``07-two-warpgroups-128x256.py``), ``best:`` since ``benchmarks/kernels.py`` timed it at 95.8 % / 99.7 %
(median of 3 runs, ``benchmarks/results/2026-12-02-h200/speed/``). This script times one parameterized
kernel for each config of a hand-picked grid (CONFIGS below, each with the reason it is there) on
both README matmul shapes of ``benchmarks/kernels.py`` (FULL_CASES), with that file's inputs,
correctness check and timing (``cutile_perf.bench``: median of the samples, cold L2 unless
CUTILE_PERF_BENCH_MODE says otherwise). Every round times torch.matmul (cuBLAS) before and after the
configs of a shape, and the step file named by ``best:`` in steps.yaml (loaded from its path) next
to them, so every percentage comes from the same process. The table gives medians over the rounds.
The script never changes the work tree; a winner becomes a prepared step by hand.

Knobs that exist in cuda-tile 1.7.0 and are swept: tile M/N/K, ``occupancy``, ``num_ctas`` (a
cluster of 2 CTAs shares one tile's operand loads), ``num_worker_warps`` (4 or 8 with tileiras 13.4:
8 puts two warpgroups on the MMA, each with half the fp32 accumulator in its registers), the group
size of the grouped order, ``latency=`` on the operand loads, ``check_bounds=False`` (whole tiles
only), a persistent grid, and ``allow_tma`` on the store. Not swept, and why: an epilogue in the
output dtype is the only one there is (C is bf16, the fp32 accumulator is converted once before the
store; accumulating in bf16 would fail the check against torch); ``use_fast_acc`` only changes fp8
MMAs; tile sizes that are not powers of two (e.g. 192) are not expressible as cuTile tiles.

Usage:
  python benchmarks/matmul_sweep.py --compile-only             # CPU: compile every config for sm_90, print registers
  python benchmarks/matmul_sweep.py --precompile 16 --rounds 3 # GPU: compile in 16 processes, then time
                                                               # (about 2 minutes on an H200, 16 CPU cores)
  python benchmarks/matmul_sweep.py --only w8 --rounds 1       # configs whose label contains "w8"
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned workers import this file by name too
import kernels as kb  # noqa: E402  (benchmarks/kernels.py: cases, inputs, check, timing, step loading)

import cuda.tile as ct  # noqa: E402
import torch  # noqa: E402

from tilesuite.ops.cutile._host import current_stream, sm_count  # noqa: E402

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
ZERO = ct.PaddingMode.ZERO
CASES = [c for c in kb.FULL_CASES if c.kind == "matmul"]  # 4096^3 and 8192^3 bf16


def grouped_tile(tile_id, M, N, TM, TN, GROUP):
    """(tile row, tile col) of the tile_id-th output tile in grouped order: bands of GROUP tile-rows,
    walked column by column (the order of matmul step 02). GROUP=1 is plain row-major order."""
    tiles_m = ct.cdiv(M, TM)
    tiles_per_band = GROUP * ct.cdiv(N, TN)
    first_row = (tile_id // tiles_per_band) * GROUP
    band_rows = min(tiles_m - first_row, GROUP)
    in_band = tile_id % tiles_per_band
    return first_row + in_band % band_rows, in_band // band_rows


def _operand(X, index, shape, LATENCY, CHECKED):
    """One operand tile. ``latency=`` only when asked (a kernel argument cannot be None); unchecked
    loads carry no padding mode, because tileiras 13.4 refuses padding_mode with check_bounds=False."""
    if CHECKED:
        if LATENCY > 0:
            return ct.load(X, index=index, shape=shape, padding_mode=ZERO, latency=LATENCY)
        return ct.load(X, index=index, shape=shape, padding_mode=ZERO)
    if LATENCY > 0:
        return ct.load(X, index=index, shape=shape, check_bounds=False, latency=LATENCY)
    return ct.load(X, index=index, shape=shape, check_bounds=False)


def _output_tile(A, B, C, tile_id, num_k_tiles, TM, TN, TK, GROUP, LATENCY, CHECKED, STORE_TMA):
    bid_m, bid_n = grouped_tile(tile_id, A.shape[0], B.shape[1], TM, TN, GROUP)
    acc = ct.full((TM, TN), 0.0, dtype=ct.float32)
    for k in range(num_k_tiles):
        a = _operand(A, (bid_m, k), (TM, TK), LATENCY, CHECKED)
        b = _operand(B, (k, bid_n), (TK, TN), LATENCY, CHECKED)
        acc = ct.mma(a, b, acc)
    ct.store(C, index=(bid_m, bid_n), tile=acc.astype(C.dtype), allow_tma=STORE_TMA, check_bounds=CHECKED)


@ct.kernel
def matmul_sweep_kernel(A, B, C, TM: ConstInt, TN: ConstInt, TK: ConstInt, GROUP: ConstInt, LATENCY: ConstInt,
                        CHECKED: ConstBool, PERSISTENT: ConstBool, STORE_TMA: ConstBool):
    # With every flag at its default (LATENCY 0, CHECKED, not PERSISTENT, STORE_TMA) this is step 03's
    # kernel body; the hints (occupancy, num_ctas, num_worker_warps) come from replace_hints per config.
    num_k_tiles = ct.num_tiles(A, axis=1, shape=(TM, TK))  # rounded up: a partial last K tile is zero-padded
    if PERSISTENT:
        num_tiles = ct.cdiv(A.shape[0], TM) * ct.cdiv(B.shape[1], TN)
        for tile_id in range(ct.bid(0), num_tiles, ct.num_blocks(0)):
            _output_tile(A, B, C, tile_id, num_k_tiles, TM, TN, TK, GROUP, LATENCY, CHECKED, STORE_TMA)
    else:
        _output_tile(A, B, C, ct.bid(0), num_k_tiles, TM, TN, TK, GROUP, LATENCY, CHECKED, STORE_TMA)


@dataclass(frozen=True)
class MatmulConfig:
    tm: int
    tn: int
    tk: int
    occupancy: int = 1  # occupancy hint: CTAs per SM the compiler sizes registers and shared memory for
    warps: int = 0  # num_worker_warps hint, 0 = the compiler's choice
    num_ctas: int = 1  # CTAs per cluster working on one tile
    group: int = 8  # tile-rows per band of the grouped order
    latency: int = 0  # latency= on both operand loads, 0 = none (the compiler infers it)
    checked: bool = True  # False: check_bounds=False on loads and store (whole tiles only)
    persistent: bool = False  # grid = SMs / num_ctas x occupancy CTAs striding over the tiles
    store_tma: bool = True  # False: allow_tma=False on the store (registers to global)

    def label(self) -> str:
        return (f"{self.tm}x{self.tn}x{self.tk} occ{self.occupancy}"
                + (f" w{self.warps}" if self.warps else "") + (f" nc{self.num_ctas}" if self.num_ctas > 1 else "")
                + f" g{self.group}" + (f" lat{self.latency}" if self.latency else "")
                + ("" if self.checked else " unchecked") + (" persistent" if self.persistent else "")
                + ("" if self.store_tma else " store=stg"))

    def hints(self) -> dict:
        return {"occupancy": self.occupancy, **({"num_worker_warps": self.warps} if self.warps else {}),
                **({"num_ctas": self.num_ctas} if self.num_ctas > 1 else {})}

    def constants(self) -> list:
        """The kernel's constant arguments after A, B, C, in its parameter order."""
        return [self.tm, self.tn, self.tk, self.group, self.latency, self.checked, self.persistent, self.store_tma]

    def grid(self, m: int, n: int, device_index: int) -> tuple[int, int, int]:
        tiles = ct.cdiv(m, self.tm) * ct.cdiv(n, self.tn)
        if self.persistent:  # one wave of clusters: SMs / CTAs per cluster, times the CTAs per SM asked for
            return (min(tiles, sm_count(device_index) // self.num_ctas * self.occupancy), 1, 1)
        return (tiles, 1, 1)


C_ = MatmulConfig
# The grid, in families. Both shapes are whole multiples of every tile here. Wave counts on 132 SMs:
# 128x128 at 4096^3 is 1024 tiles = 3.9 waves of 264 CTAs (occupancy 2); 128x256 is 512 tiles = 3.9
# waves of 132. Registers, stack and shared memory in the comments are from `--compile-only` (AOT
# sm_90 cubins, tileiras 13.4, cuobjdump). Left out because `--compile-only` showed the same SASS,
# registers and shared memory as a config below (timing both would waste GPU time): 128x128x64
# occupancy 2 with 8 warps (= occupancy 1 with 8 warps: 168 registers x 384 threads and 193 KB leave
# room for one CTA), latency 3, 6 or 10 on 128x128x64 occupancy 2 (= no hint), check_bounds=False
# on 128x128x64 and 128x256x64 (= checked: TMA bounds-checks in hardware either way), 128x256x64
# occupancy 2 on a 2-CTA cluster (= occupancy 1), 256x128x64 occupancy 2 with 8 warps on 2 CTAs
# (= occupancy 1). Left out as spilling: the persistent grid at 128x128x64 occupancy 2 (152 B of
# stack, as step 04). Left out as unpromising: latency 1 on 128x128x64 (97 KB, a shallower pipeline
# than the default's 105 KB), 64x256x64 (occupancy 2 not honoured: 255 registers, 225 KB, so it is
# the probe's 1.09x config again).
CONFIGS: list[tuple[MatmulConfig, str]] = [
    # 128x128x64: the shipped tile, and the single knobs around step 03 (128 registers, 105 KB, 256 threads).
    (C_(128, 128, 64, 2), "step 03 in the sweep kernel: must time like the step file (same body, same hints)"),
    (C_(128, 128, 64, 1), "step 02: 255 registers, 193 KB (a deeper TMA pipeline), no second CTA"),
    (C_(128, 128, 64, 1, warps=8), "two MMA warpgroups of 64x128 (168 registers, 384 threads, 193 KB)"),
    (C_(128, 128, 64, 2, group=4), "smaller L2 band: 4 tile-rows share the B panels"),
    (C_(128, 128, 64, 2, group=16), "larger band: 16 tile-rows"),
    (C_(128, 128, 32, 2), "K tile 32: 16 KB per stage instead of 32 (113 KB): more, smaller TMA stages"),
    (C_(128, 128, 128, 1), "K tile 128: half the K-loop trips and barriers (225 KB)"),
    (C_(128, 128, 64, 2, store_tma=False), "epilogue stored from registers (STG), no shared-memory staging"),
    (C_(128, 128, 64, 1, persistent=True), "persistent grid of 132 CTAs: no stack at occupancy 1 (step 04 spilled)"),
    # 128x256x64 with 8 worker warps: two consumer warpgroups of 64x256 each (168 registers, no stack,
    # 209 KB), the usual Hopper GEMM tile. With the default 4 warps it spills 1.8 KB per thread (the
    # probe's 13.8x slower config). Twice the FLOPs per loaded byte of 128x128.
    (C_(128, 256, 64, 1, warps=8), "128x256 tile, 2 MMA warpgroups"),
    (C_(128, 256, 64, 1, warps=8, group=4), "same, smaller band"),
    (C_(128, 256, 64, 1, warps=8, group=16), "same, larger band"),
    (C_(128, 256, 32, 1, warps=8), "same with K tile 32 (185 KB)"),
    (C_(128, 256, 64, 1, warps=8, latency=3), "latency 3: the compiler sizes the pipeline at 193 KB"),
    (C_(128, 256, 64, 1, warps=8, latency=6), "latency 6: 225 KB, the deepest pipeline of the hints"),
    (C_(128, 256, 64, 1, warps=8, latency=10), "latency 10: 209 KB but other SASS than no hint"),
    (C_(128, 256, 64, 1, warps=8, persistent=True), "persistent: one CTA per SM, a tile's store overlaps the next"),
    (C_(128, 256, 64, 1, warps=8, store_tma=False), "epilogue from registers (STG)"),
    (C_(128, 256, 64, 1, warps=8, num_ctas=2), "on a 2-CTA cluster (225 KB)"),
    (C_(128, 256, 64, 1, warps=8, num_ctas=2, persistent=True), "cluster of 2 and persistent (66 clusters)"),
    # 256x128x64: the transposed split.
    (C_(256, 128, 64, 1, warps=8), "256x128 tile, 2 MMA warpgroups (168 registers, 209 KB)"),
    (C_(256, 128, 64, 1, warps=8, num_ctas=2), "same on a 2-CTA cluster: 128x128 per CTA, 2 warpgroups (177 KB)"),
    # 2-CTA clusters of the probe's ranks 2 and 3, now with the grouped order.
    (C_(256, 128, 64, 1, num_ctas=2), "probe rank 2 (1.026x of 128x128 without grouping or occupancy; 255 regs)"),
    (C_(256, 128, 64, 2, num_ctas=2), "rank 2 at occupancy 2: 128 registers, 113 KB, so step 03 per CTA on a cluster"),
    (C_(128, 256, 64, 1, num_ctas=2), "probe rank 3 (1.033x; 255 registers, 225 KB)"),
    # 256x256 on a 2-CTA cluster with 8 warps: each CTA a 128x256 half with two warpgroups (step 05's
    # tile, which spilled 1.8 KB per thread with the default warps; here 168 registers, no stack).
    (C_(256, 256, 64, 1, warps=8, num_ctas=2), "256x256 over 2 CTAs of 128x256, 2 warpgroups each (209 KB)"),
    (C_(256, 256, 32, 1, warps=8, num_ctas=2), "same with K tile 32 (169 KB)"),
]


def configs(only: list[str] | None = None) -> list[MatmulConfig]:
    return [cfg for cfg, _why in CONFIGS if not only or any(o in cfg.label() for o in only)]


def config_problems(cfg: MatmulConfig, shapes: list[tuple[int, int, int]]) -> list[str]:
    """Why ``cfg`` cannot run correctly or cannot be asked for (empty when it can): tile sizes powers of
    two, hints within cuda-tile's ranges, whole tiles for unchecked configs."""
    problems = []
    for name, v in (("tile M", cfg.tm), ("tile N", cfg.tn), ("tile K", cfg.tk), ("group", cfg.group)):
        if v < 1 or v & (v - 1):
            problems.append(f"{name} {v} is not a power of two")
    if cfg.num_ctas not in (1, 2, 4, 8, 16):
        problems.append(f"num_ctas {cfg.num_ctas} is not a power of two in 1..16")
    if cfg.warps not in (0, 4, 8):  # other values need tileiras/CTK 13.5 (help(ct.kernel))
        problems.append(f"num_worker_warps {cfg.warps}: only 4 or 8 with tileiras 13.4")
    if not 1 <= cfg.occupancy <= 32:
        problems.append(f"occupancy {cfg.occupancy} outside 1..32")
    if not 0 <= cfg.latency <= 10:
        problems.append(f"latency {cfg.latency} outside 1..10 (0 = no hint)")
    if not cfg.checked:
        for m, n, k in shapes:
            if m % cfg.tm or n % cfg.tn or k % cfg.tk:
                problems.append(f"unchecked but {m}x{n}x{k} is not whole {cfg.tm}x{cfg.tn}x{cfg.tk} tiles")
    return problems


def matmul_function(cfg: MatmulConfig):
    kernel = matmul_sweep_kernel.replace_hints(**cfg.hints())

    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        m, n = a.shape[0], b.shape[1]
        c = torch.empty((m, n), dtype=a.dtype, device=a.device)
        ct.launch(current_stream(), cfg.grid(m, n, a.device.index), kernel, (a, b, c, *cfg.constants()))
        return c

    return run


def best_step() -> tuple[str, object]:
    """(label, function) of the step file that steps.yaml calls best, loaded from its path."""
    label, path = kb.versions("matmul", all_steps=False)[1]
    return f"step {label}", kb.load_function(CASES[0], path)


# --- compile without a GPU -------------------------------------------------------------------------


def sass_digest(cubin: Path, cuobjdump: Path) -> str | None:
    """A short hash of the cubin's SASS instructions (addresses, encodings and names left out): two
    configs with the same digest run the same machine code, so timing both is wasted GPU time."""
    env = {**os.environ, "PATH": f"{cuobjdump.parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # nvdisasm
    proc = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True, env=env, timeout=120)
    code = [line.split("*/", 1)[1].split(";")[0].strip() for line in proc.stdout.splitlines()
            if line.lstrip().startswith("/*") and "*/" in line]
    return hashlib.sha1("\n".join(code).encode()).hexdigest()[:10] if proc.returncode == 0 and code else None


def inspect_config(cfg: MatmulConfig, arch: str = "sm_90") -> dict:
    """AOT-compile ``cfg`` for ``arch`` (the JIT's signature for fresh contiguous bf16 tensors) and
    return what came out: registers, stack, shared memory, threads, TMA loads/stores, SASS digest.
    A compile error propagates."""
    from cutile_perf.kernel.compile_report import find_cuobjdump, inspect_cubin, summarize_remarks
    from cutile_perf.kernel.compilecheck import compile_signature
    from tilesuite.aot import contiguous, signature

    sig = signature([contiguous(ct.bfloat16, 2)] * 3 + cfg.constants())
    cuobjdump = find_cuobjdump()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="matmul-sweep-") as tmp:
        cubin, remarks = compile_signature(matmul_sweep_kernel.replace_hints(**cfg.hints()), sig, arch, Path(tmp))
        info = {"ok": True, "seconds": round(time.perf_counter() - start, 2)}
        summary = summarize_remarks(remarks) if remarks is not None else {}
        info.update(tma_loads=summary.get("tma_loads"), tma_stores=summary.get("tma_stores"))
        if cuobjdump is not None:
            path = Path(tmp) / "kernel.cubin"
            path.write_bytes(cubin)
            info.update(inspect_cubin(path, cuobjdump), sass_digest=sass_digest(path, cuobjdump))
    return info


def _inspect_job(job: tuple) -> dict:
    cfg, arch = job
    try:
        return inspect_config(cfg, arch)
    except Exception as exc:  # a missing cuobjdump or tileiras is a row, not the end of the table
        return {"ok": False, "error": kb._error(exc)}


def regs_text(info: dict | None) -> str:
    if not info or "registers" not in info:
        return "n/a"
    return f"{info['registers']} / {info['stack']} B"


def compile_only(arch: str, only: list[str], processes: int) -> int:
    """Compile every config for ``arch`` on this machine and print registers, stack, shared memory."""
    cfgs = configs(only)
    shapes = [c.shape for c in CASES]
    infos = kb.run_pool(_inspect_job, [(cfg, arch) for cfg in cfgs], processes) if processes > 1 else \
        [_inspect_job((cfg, arch)) for cfg in cfgs]
    print("| config | registers / stack | shared (KB) | threads | TMA loads/stores | SASS digest | compile s | note |")
    print("|---|---|---|---|---|---|---|---|")
    failures = 0
    first_with: dict[str, str] = {}  # SASS digest and resources -> the first config that compiled to it
    for cfg, info in zip(cfgs, infos):
        notes = config_problems(cfg, shapes)
        if not info.get("ok"):
            failures += 1
            notes.append(f"FAILED {info.get('error', '')[:160]}")
        if info.get("stack") or info.get("local"):
            notes.append("SPILLS")
        # Same machine code AND the same registers, shared memory and threads: the same kernel.
        digest = info.get("sass_digest") and f"{info['sass_digest']} {regs_text(info)} {info.get('shared')} {info.get('threads')}"
        if digest and digest in first_with:
            notes.append(f"same SASS as {first_with[digest]}")
        elif digest:
            first_with[digest] = cfg.label()
        shared = f"{info['shared'] / 1024:.0f}" if "shared" in info else "n/a"
        tma = f"{info.get('tma_loads')}/{info.get('tma_stores')}" if info.get("ok") else "n/a"
        print(f"| {cfg.label()} | {regs_text(info)} | {shared} | {info.get('threads', 'n/a')} | {tma} | "
              f"{info.get('sass_digest') or 'n/a'} | {info.get('seconds', 'n/a')} | {'; '.join(notes)} |", flush=True)
    return 1 if failures else 0


# --- the GPU run -----------------------------------------------------------------------------------


def _precompile_job(job: tuple) -> tuple[str, dict | None]:
    """Worker: run one config (None: the best step file) once on the 4096^3 inputs, so cuTile compiles
    it into its disk cache with the timed run's specialization (both shapes are multiples of 16);
    with ``inspect``, also AOT-compile it for sm_90 to report registers."""
    cfg, inspect = job
    try:
        fn = best_step()[1] if cfg is None else matmul_function(cfg)
        fn(*kb.make_inputs(CASES[0]))
        torch.cuda.synchronize()
        error = ""
    except Exception as exc:
        error = f"{'best step' if cfg is None else cfg.label()}: {kb._error(exc)}"
    info = _inspect_job((cfg, "sm_90")) if inspect and cfg is not None else None
    return error, info


def time_all(fns: list[tuple[str, object]], rounds: int, budget: dict) -> dict:
    """{(shape label, fn label): [ms per round]}; None entries for a failed check or timing. cuBLAS is
    timed before and after the configs of each shape in every round (two samples per round)."""
    results: dict = {}
    failed: dict = {}
    for rnd in range(1, rounds + 1):
        for case in CASES:
            shape = "x".join(map(str, case.shape))
            inputs = kb.make_inputs(case)
            expected = torch.matmul(*inputs)
            for label, fn in [("cuBLAS (torch.matmul)", torch.matmul), *fns, ("cuBLAS (torch.matmul)", torch.matmul)]:
                key = (shape, label)
                if key in failed:
                    continue
                try:
                    wrong = kb.check_close(fn(*inputs), expected) if rnd == 1 else ""
                except Exception as exc:  # a config that fails to compile or launch is a result too
                    wrong = kb._error(exc)
                ms, note = (None, wrong) if wrong else kb.try_time(functools.partial(fn, *inputs), budget)
                if ms is None:
                    failed[key] = note
                    print(f"round {rnd} {shape} {label}: {note}", file=sys.stderr, flush=True)
                    continue
                results.setdefault(key, []).append(ms)
                print(f"round {rnd} {shape} {label}: {ms:.4f} ms", file=sys.stderr, flush=True)
            del inputs, expected
            torch.cuda.empty_cache()
    return {"ms": results, "failed": failed}


def render(fns: list[tuple[str, object]], timed: dict, infos: dict) -> str:
    shapes = ["x".join(map(str, c.shape)) for c in CASES]
    cublas = {s: statistics.median(timed["ms"][(s, "cuBLAS (torch.matmul)")]) for s in shapes
              if (s, "cuBLAS (torch.matmul)") in timed["ms"]}
    head = ["config"] + [f"{s} ms" for s in shapes] + [f"{s} % of cuBLAS" for s in shapes] + ["registers / stack", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    for label, _fn in [("cuBLAS (torch.matmul)", None), *fns]:
        ms = {s: statistics.median(timed["ms"][(s, label)]) if (s, label) in timed["ms"] else None for s in shapes}
        pct = {s: 100.0 * cublas[s] / ms[s] if ms[s] and s in cublas else None for s in shapes}
        notes = [f"{s}: {timed['failed'][(s, label)]}" for s in shapes if (s, label) in timed["failed"]]
        worst = min((p for p in pct.values() if p is not None), default=-1.0) if all(pct.values()) else -1.0
        rows.append((worst, [label] + [f"{ms[s]:.4f}" if ms[s] else "n/a" for s in shapes]
                     + [f"{pct[s]:.1f} %" if pct[s] else "n/a" for s in shapes]
                     + [regs_text(infos.get(label)), "; ".join(notes)]))
    # cuBLAS first, then by the worse of the two shapes' % of cuBLAS: the goal is >= 95 % on both.
    lines += ["| " + " | ".join(r) + " |" for _w, r in [rows[0]] + sorted(rows[1:], key=lambda x: -x[0])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true", help="compile every config for --arch here, no GPU")
    parser.add_argument("--arch", default="sm_90", help="--compile-only's target (default sm_90, the H200)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only configs whose label contains TEXT (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds; the table gives medians (default 3)")
    parser.add_argument("--precompile", type=int, default=0, metavar="N",
                        help="compile every config first in N processes (cuTile's disk cache); --compile-only: "
                             "the number of compile processes")
    parser.add_argument("--no-registers", action="store_true",
                        help="GPU run: skip the AOT compile per config that fills the registers column")
    parser.add_argument("--list", action="store_true", help="print the configs and why each is there, then exit")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.list:
        for cfg, why in CONFIGS:
            if not args.only or any(o in cfg.label() for o in args.only):
                print(f"{cfg.label():42s} {why}")
        return 0
    if args.compile_only:
        return compile_only(args.arch, args.only, max(1, args.precompile))
    if not torch.cuda.is_available():
        print("benchmarks/matmul_sweep.py needs a CUDA GPU (or --compile-only)", file=sys.stderr)
        return 3
    cfgs = configs(args.only)
    jobs = [(None, False)] + [(cfg, not args.no_registers) for cfg in cfgs]
    if args.precompile > 0:
        done = kb.run_pool(_precompile_job, jobs, args.precompile)
    else:  # registers still come from AOT compiles, in this process
        done = [("", None if args.no_registers or cfg is None else _inspect_job((cfg, "sm_90"))) for cfg, _ in jobs]
    infos = {}
    for (cfg, _), (error, info) in zip(jobs, done):
        if error:
            print(f"precompile: {error}", file=sys.stderr, flush=True)
        if cfg is not None:
            infos[cfg.label()] = info
    fns = [best_step()] + [(cfg.label(), matmul_function(cfg)) for cfg in cfgs]
    mode = kb.bench.check_mode(None)
    timed = time_all(fns, args.rounds, {"mode": mode})
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs), torch {torch.__version__}; "
          f"medians of {args.rounds} rounds, each a median of cutile_perf.bench samples (mode {mode}); "
          "% of cuBLAS = cuBLAS ms / config ms (cuBLAS: median of its before/after samples of every round); "
          "sorted by the worse shape. Registers / stack: AOT sm_90 cubin.\n")
    print(render(fns, timed, infos))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
