"""Sweep the structural knobs of the memory-bound bundled kernels on a GPU, side by side in one run.

An exploration aid behind the prepared steps in ``examples/kernels/optimizations/``: one
parameterized kernel per op (row normalizations, softmax, SwiGLU) is timed for each config of a
small hand-picked grid, on the README shapes of ``benchmarks/kernels.py`` (FULL_CASES), with that
file's inputs, torch reference check, copy ceiling and timing (``cutile_perf.bench``: cold L2,
CUDA events, median). A config is (rows per CTA, occupancy hint, persistent or one CTA per block,
TMA or plain LDG loads, TMA or plain STG stores; for SwiGLU: tile shape and fast sigmoid). Winners
become prepared step files; this script never changes the work tree.

Usage:
  python benchmarks/kernel_sweep.py                 # every op, every config (a few minutes: each config compiles)
  python benchmarks/kernel_sweep.py --only swiglu   # one op
  python benchmarks/kernel_sweep.py --round 3       # only the third round's configs
  python benchmarks/kernel_sweep.py --only layer_norm --round 4   # layer norm's leaner arithmetic
  python benchmarks/kernel_sweep.py --round 5 --with-compile   # check_bounds=False vs the shipped best, and Inductor
  python benchmarks/kernel_sweep.py --quick         # QUICK_CASES shapes, short budgets (smoke run)
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import cuda.tile as ct
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned compile workers import it by name too
import kernels as kb  # noqa: E402  (benchmarks/kernels.py: cases, inputs, references, timing)

from tilesuite.ops.cutile._host import as_rows, current_stream, next_power_of_2, sm_count  # noqa: E402

ZERO = ct.PaddingMode.ZERO
LOG2E = 1.4426950408889634


def _row_tile(x, TILE_M, TILE_N, LOAD_TMA, BOUNDS):
    """This CTA's (TILE_M, TILE_N) row tile. Unchecked (round 5) without a padding mode: tileiras 13.4
    fails ("failed to compile Tile IR program", nothing more) on padding_mode=ZERO with check_bounds=False."""
    if BOUNDS:
        return ct.load(x, (ct.bid(0), 0), (TILE_M, TILE_N), padding_mode=ZERO, allow_tma=LOAD_TMA)
    return ct.load(x, (ct.bid(0), 0), (TILE_M, TILE_N), allow_tma=LOAD_TMA, check_bounds=False)


@ct.kernel
def rms_norm_kernel(x, weight, out, eps: float, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int],
                    PERSISTENT: ct.Constant[bool], LOAD_TMA: ct.Constant[bool], STORE_TMA: ct.Constant[bool],
                    BOUNDS: ct.Constant[bool]):
    # BOUNDS=False (round 5): check_bounds=False on the row tiles; the host guarantees whole tiles.
    n = x.shape[1]
    w = ct.reshape(ct.astype(ct.load(weight, (0,), (TILE_N,), padding_mode=ZERO), ct.float32), (1, TILE_N))
    if PERSISTENT:
        for block in range(ct.bid(0), ct.num_tiles(x, axis=0, shape=(TILE_M, TILE_N)), ct.num_blocks(0)):
            xr = ct.astype(ct.load(x, (block, 0), (TILE_M, TILE_N), padding_mode=ZERO, latency=10,
                                   allow_tma=LOAD_TMA), ct.float32)
            rstd = ct.rsqrt(ct.sum(xr * xr, axis=1, keepdims=True) / n + eps)
            ct.store(out, (block, 0), ct.astype(xr * rstd * w, out.dtype), latency=3, allow_tma=STORE_TMA)
    else:
        xr = ct.astype(_row_tile(x, TILE_M, TILE_N, LOAD_TMA, BOUNDS), ct.float32)
        rstd = ct.rsqrt(ct.sum(xr * xr, axis=1, keepdims=True) / n + eps)
        ct.store(out, (ct.bid(0), 0), ct.astype(xr * rstd * w, out.dtype), allow_tma=STORE_TMA, check_bounds=BOUNDS)


def _layer_norm_lean(t, w, b, inv_n: float, eps: float, AFFINE_FMA: bool):
    """Round 4's one-pass body. Row statistics: both sums times 1/n (computed once per CTA) instead of an
    IEEE `/ n` per row each (MUFU.RCP, FCHK, 4 FFMA and a branch, in every thread), and rsqrt without its
    denormal path (var + eps >= eps is normal). AFFINE_FMA: ``(t * rstd - mean * rstd) * w + b``, two FMAs
    per element instead of sub, mul, FMA."""
    mean = ct.sum(t, axis=1, keepdims=True) * inv_n
    var = ct.maximum(ct.sum(t * t, axis=1, keepdims=True) * inv_n - mean * mean, 0.0)
    rstd = ct.rsqrt(var + eps, flush_to_zero=True)
    if AFFINE_FMA:
        return (t * rstd - mean * rstd) * w + b
    return (t - mean) * rstd * w + b


@ct.kernel
def layer_norm_kernel(x, weight, bias, out, eps: float, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int],
                      PERSISTENT: ct.Constant[bool], LOAD_TMA: ct.Constant[bool], STORE_TMA: ct.Constant[bool],
                      ONE_PASS: ct.Constant[bool], CHEAP_STATS: ct.Constant[bool], AFFINE_FMA: ct.Constant[bool],
                      BOUNDS: ct.Constant[bool]):
    n = x.shape[1]
    in_row = ct.reshape(ct.arange(TILE_N, dtype=ct.int32), (1, TILE_N)) < n
    w = ct.reshape(ct.astype(ct.load(weight, (0,), (TILE_N,), padding_mode=ZERO), ct.float32), (1, TILE_N))
    b = ct.reshape(ct.astype(ct.load(bias, (0,), (TILE_N,), padding_mode=ZERO), ct.float32), (1, TILE_N))
    if CHEAP_STATS:
        # Round 4 (always one-pass statistics): layer norm's extra SASS against rms_norm trimmed.
        inv_n = 1.0 / n
        if PERSISTENT:
            for block in range(ct.bid(0), ct.num_tiles(x, axis=0, shape=(TILE_M, TILE_N)), ct.num_blocks(0)):
                t = ct.astype(ct.load(x, (block, 0), (TILE_M, TILE_N), padding_mode=ZERO, latency=10,
                                      allow_tma=LOAD_TMA), ct.float32)
                ct.store(out, (block, 0), ct.astype(_layer_norm_lean(t, w, b, inv_n, eps, AFFINE_FMA), out.dtype),
                         latency=3, allow_tma=STORE_TMA)
        else:
            t = ct.astype(_row_tile(x, TILE_M, TILE_N, LOAD_TMA, BOUNDS), ct.float32)
            ct.store(out, (ct.bid(0), 0), ct.astype(_layer_norm_lean(t, w, b, inv_n, eps, AFFINE_FMA), out.dtype),
                     allow_tma=STORE_TMA, check_bounds=BOUNDS)
    elif PERSISTENT:
        for block in range(ct.bid(0), ct.num_tiles(x, axis=0, shape=(TILE_M, TILE_N)), ct.num_blocks(0)):
            t = ct.astype(ct.load(x, (block, 0), (TILE_M, TILE_N), padding_mode=ZERO, latency=10,
                                  allow_tma=LOAD_TMA), ct.float32)
            mean = ct.sum(t, axis=1, keepdims=True) / n
            if ONE_PASS:
                rstd = ct.rsqrt(ct.sum(t * t, axis=1, keepdims=True) / n - mean * mean + eps)
                y = (t - mean) * rstd * w + b
            else:
                dev = ct.where(in_row, t - mean, 0.0)
                y = dev * ct.rsqrt(ct.sum(dev * dev, axis=1, keepdims=True) / n + eps) * w + b
            ct.store(out, (block, 0), ct.astype(y, out.dtype), latency=3, allow_tma=STORE_TMA)
    elif ONE_PASS:
        # Both sums from the same registers at once (var = E[x^2] - mean^2): no reduction waits on another.
        t = ct.astype(ct.load(x, (ct.bid(0), 0), (TILE_M, TILE_N), padding_mode=ZERO, allow_tma=LOAD_TMA),
                      ct.float32)
        mean = ct.sum(t, axis=1, keepdims=True) / n
        rstd = ct.rsqrt(ct.sum(t * t, axis=1, keepdims=True) / n - mean * mean + eps)
        ct.store(out, (ct.bid(0), 0), ct.astype((t - mean) * rstd * w + b, out.dtype), allow_tma=STORE_TMA)
    else:
        t = ct.astype(ct.load(x, (ct.bid(0), 0), (TILE_M, TILE_N), padding_mode=ZERO, allow_tma=LOAD_TMA),
                      ct.float32)
        dev = ct.where(in_row, t - ct.sum(t, axis=1, keepdims=True) / n, 0.0)
        rstd = ct.rsqrt(ct.sum(dev * dev, axis=1, keepdims=True) / n + eps)
        ct.store(out, (ct.bid(0), 0), ct.astype(dev * rstd * w + b, out.dtype), allow_tma=STORE_TMA)


@ct.kernel
def softmax_kernel(x, out, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int],
                   PERSISTENT: ct.Constant[bool], LOAD_TMA: ct.Constant[bool], STORE_TMA: ct.Constant[bool]):
    in_row = ct.reshape(ct.arange(TILE_N, dtype=ct.int32), (1, TILE_N)) < x.shape[1]
    if PERSISTENT:
        for block in range(ct.bid(0), ct.num_tiles(x, axis=0, shape=(TILE_M, TILE_N)), ct.num_blocks(0)):
            t = ct.load(x, (block, 0), (TILE_M, TILE_N), padding_mode=ZERO, latency=10, allow_tma=LOAD_TMA)
            t = ct.where(in_row, ct.astype(t, ct.float32) * LOG2E, float("-inf"))
            e = ct.exp2(t - ct.max(t, axis=1, keepdims=True), flush_to_zero=True)
            ct.store(out, (block, 0), ct.astype(e * (1.0 / ct.sum(e, axis=1, keepdims=True)), out.dtype),
                     latency=3, allow_tma=STORE_TMA)
    else:
        t = ct.load(x, (ct.bid(0), 0), (TILE_M, TILE_N), padding_mode=ZERO, allow_tma=LOAD_TMA)
        t = ct.where(in_row, ct.astype(t, ct.float32) * LOG2E, float("-inf"))
        e = ct.exp2(t - ct.max(t, axis=1, keepdims=True), flush_to_zero=True)
        ct.store(out, (ct.bid(0), 0), ct.astype(e * (1.0 / ct.sum(e, axis=1, keepdims=True)), out.dtype),
                 allow_tma=STORE_TMA)


@ct.kernel
def swiglu_kernel(a, b, out, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int], FAST: ct.Constant[bool],
                  LOAD_TMA: ct.Constant[int]):
    idx = (ct.bid(0), ct.bid(1))
    if LOAD_TMA == 1:  # 1: allow_tma=True; 0: the compiler's choice (a kernel argument cannot be None)
        av = ct.astype(ct.load(a, idx, (TILE_M, TILE_N), padding_mode=ZERO, allow_tma=True), ct.float32)
        bv = ct.astype(ct.load(b, idx, (TILE_M, TILE_N), padding_mode=ZERO, allow_tma=True), ct.float32)
    else:
        av = ct.astype(ct.load(a, idx, (TILE_M, TILE_N), padding_mode=ZERO), ct.float32)
        bv = ct.astype(ct.load(b, idx, (TILE_M, TILE_N), padding_mode=ZERO), ct.float32)
    if FAST:
        denom = 1.0 + ct.exp2(av * -LOG2E, flush_to_zero=True)
        gated = ct.truediv(av, denom, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX) * bv
    else:
        gated = av / (1.0 + ct.exp(0.0 - av)) * bv
    ct.store(out, idx, ct.astype(gated, out.dtype))


def _flat_tile(a, TILE, BOUNDS, LATENCY):
    """This CTA's tile of a 1-D array; unchecked without a padding mode (see _row_tile)."""
    if BOUNDS:
        if LATENCY > 0:
            return ct.load(a, (ct.bid(0),), (TILE,), padding_mode=ZERO, latency=LATENCY)
        return ct.load(a, (ct.bid(0),), (TILE,), padding_mode=ZERO)
    if LATENCY > 0:
        return ct.load(a, (ct.bid(0),), (TILE,), check_bounds=False, latency=LATENCY)
    return ct.load(a, (ct.bid(0),), (TILE,), check_bounds=False)


@ct.kernel
def swiglu_flat_kernel(a, b, out, TILE: ct.Constant[int], BOUNDS: ct.Constant[bool], LATENCY: ct.Constant[int]):
    """The tensors as 1-D arrays: one tile index, no per-row bounds. Round 5: BOUNDS=False drops the
    bounds check (the host guarantees whole tiles); LATENCY > 0 gives both loads that latency hint."""
    av = ct.astype(_flat_tile(a, TILE, BOUNDS, LATENCY), ct.float32)
    bv = ct.astype(_flat_tile(b, TILE, BOUNDS, LATENCY), ct.float32)
    denom = 1.0 + ct.exp2(av * -LOG2E, flush_to_zero=True)
    gated = ct.truediv(av, denom, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX) * bv
    ct.store(out, (ct.bid(0),), ct.astype(gated, out.dtype), check_bounds=BOUNDS)


@dataclass(frozen=True)
class RowConfig:
    """A row kernel's launch: rows per CTA, occupancy hint (0 = none), persistent grid, TMA load/store."""
    tile_m: int
    occupancy: int
    persistent: bool
    load_tma: bool
    store_tma: bool
    warps: int = 0  # num_worker_warps hint, 0 = the compiler's default (4)
    one_pass: bool = False  # layer norm only: mean and E[x^2] in one pass (non-persistent kernel)
    cheap_stats: bool = False  # layer norm only (round 4, one-pass): sums times 1/n, rsqrt without denormal path
    affine_fma: bool = False  # layer norm only (round 4, with cheap_stats): y = (x*rstd - mean*rstd)*w + b, 2 FMAs
    bounds: bool = True  # round 5: False = check_bounds=False on the row tiles (whole tiles only)

    def label(self) -> str:
        return (f"tm={self.tile_m} occ={self.occupancy or '-'} warps={self.warps or '-'} "
                f"{'persistent' if self.persistent else 'grid=all'} "
                f"load={'tma' if self.load_tma else 'ldg'} store={'tma' if self.store_tma else 'stg'}"
                + (" one-pass" if self.one_pass else "") + (" cheap-stats" if self.cheap_stats else "")
                + (" fma-affine" if self.affine_fma else "") + ("" if self.bounds else " unchecked"))


@dataclass(frozen=True)
class SwigluConfig:
    tile_m: int  # 0 = the tensors viewed as 1-D, tile_n elements per CTA
    tile_n: int
    occupancy: int
    fast: bool
    load_tma: bool | None = None  # None: the compiler chooses (it picks LDG here, and with True too)
    bounds: bool = True  # flat only (round 5): False = check_bounds=False (whole tiles only)
    latency: int = 0  # flat only (round 5): latency hint on both loads, 0 = none

    def label(self) -> str:
        shape = f"flat {self.tile_n}" if self.tile_m == 0 else f"{self.tile_m}x{self.tile_n}"
        tma = {None: "", True: " load=tma", False: " load=ldg"}[self.load_tma]
        return (f"tile={shape} occ={self.occupancy or '-'} {'fast' if self.fast else 'precise'} sigmoid{tma}"
                + ("" if self.bounds else " unchecked") + (f" latency={self.latency}" if self.latency else ""))


def _row_grid(rows: int, cfg: RowConfig, device_index: int) -> tuple[int]:
    blocks = ct.cdiv(rows, cfg.tile_m)
    return (min(blocks, sm_count(device_index) * max(1, cfg.occupancy)),) if cfg.persistent else (blocks,)


def _hinted(kernel, occupancy: int, warps: int = 0):
    hints = {**({"occupancy": occupancy} if occupancy else {}), **({"num_worker_warps": warps} if warps else {})}
    return kernel.replace_hints(**hints) if hints else kernel


def row_function(op: str, cfg: RowConfig):
    kernel = _hinted({"rms_norm": rms_norm_kernel, "layer_norm": layer_norm_kernel, "softmax": softmax_kernel}[op],
                     cfg.occupancy, cfg.warps)
    flags = (cfg.persistent, cfg.load_tma, cfg.store_tma)

    def run(x, *params):
        rows = as_rows(x)
        out = torch.empty_like(rows)
        tile_n = next_power_of_2(rows.shape[1])
        if not cfg.bounds and (rows.shape[0] % cfg.tile_m or rows.shape[1] != tile_n):
            raise ValueError(f"unchecked tiles need whole tiles: {tuple(rows.shape)} vs {cfg.tile_m}x{tile_n}")
        grid = _row_grid(rows.shape[0], cfg, rows.device.index)
        if op == "softmax":
            args = (rows, out, cfg.tile_m, tile_n, *flags)
        elif op == "layer_norm":
            args = (rows, *[p.contiguous() for p in params], out, 1e-5, cfg.tile_m, tile_n, *flags, cfg.one_pass,
                    cfg.cheap_stats, cfg.affine_fma, cfg.bounds)
        else:
            eps = 1e-6 if op == "rms_norm" else 1e-5
            args = (rows, *[p.contiguous() for p in params], out, eps, cfg.tile_m, tile_n, *flags, cfg.bounds)
        ct.launch(current_stream(), grid, kernel, args)
        return out.view(x.shape)

    return run


def swiglu_function(cfg: SwigluConfig):
    kernel = _hinted(swiglu_flat_kernel if cfg.tile_m == 0 else swiglu_kernel, cfg.occupancy)

    def run(a, b):
        if cfg.tile_m == 0:
            a1, b1 = a.contiguous().view(-1), b.contiguous().view(-1)
            if not cfg.bounds and a1.numel() % cfg.tile_n:
                raise ValueError(f"unchecked tiles need whole tiles: {a1.numel()} elements, tile {cfg.tile_n}")
            out = torch.empty_like(a1)
            ct.launch(current_stream(), (ct.cdiv(a1.numel(), cfg.tile_n),), kernel,
                      (a1, b1, out, cfg.tile_n, cfg.bounds, cfg.latency))
            return out.view(a.shape)
        a2, b2 = as_rows(a), as_rows(b)
        out = torch.empty_like(a2)
        grid = (ct.cdiv(a2.shape[0], cfg.tile_m), ct.cdiv(a2.shape[1], cfg.tile_n))
        ct.launch(current_stream(), grid, kernel, (a2, b2, out, cfg.tile_m, cfg.tile_n, cfg.fast, int(bool(cfg.load_tma))))
        return out.view(a.shape)

    return run


def row_configs(row_bytes: int, rounds: set[int] | None = None) -> list[RowConfig]:
    """Rows per CTA scaled to the row size (about 8, 16 or 32 KB of input per CTA), then the knobs.
    Round 1 was the first H200 sweep, 2 and 3 refine around its winners, 4 trims layer norm's instruction
    count towards rms_norm's (layer norm only); `rounds` picks some."""
    tm8 = max(1, 8192 // row_bytes)
    tm16, tm32 = 2 * tm8, 4 * tm8
    t, f = True, False
    first = [
        RowConfig(tm16, 4, t, t, t),   # the shipped best steps (TMA load and store, persistent, occupancy 4)
        RowConfig(tm16, 4, t, t, f),   # ... with a register-to-global store
        RowConfig(tm32, 1, t, t, f),   # TileGym's static persistent: 1 CTA per SM, bigger tiles
        RowConfig(tm32, 2, t, t, f),
        RowConfig(tm8, 4, t, t, f),
        RowConfig(tm16, 4, t, f, f),   # no TMA at all, persistent
        RowConfig(tm8, 4, t, f, f),
        RowConfig(tm16, 4, f, f, f),   # no TMA, one CTA per row block (Triton's shape)
        RowConfig(tm8, 4, f, f, f),
        RowConfig(tm8, 2, f, f, f),
        RowConfig(tm8, 0, f, f, f),
        RowConfig(tm16, 4, f, t, f),   # TMA load, no persistence
        RowConfig(max(1, tm8 // 4), 0, f, f, f),  # one ~2 KB row per CTA (TileGym's multi-wave kernels)
        RowConfig(tm16, 2, t, t, f, 8),  # 8 worker warps (TileGym's layer norm default on sm_90)
        RowConfig(tm16, 2, f, f, f, 8),
        RowConfig(tm32, 1, t, t, f, 8),
    ]
    second = [  # around the first round's winner (TMA load, STG store, one CTA per row block)
        RowConfig(tm8, 4, f, t, f),
        RowConfig(tm16, 2, f, t, f),
        RowConfig(tm32, 2, f, t, f),
        RowConfig(tm8, 8, f, t, f),
        RowConfig(max(1, tm8 // 2), 8, f, t, f),
        RowConfig(tm16, 4, f, t, f, 8),
        RowConfig(tm8, 4, f, f, f),
        RowConfig(max(1, tm8 // 2), 4, f, f, f),
        RowConfig(max(1, tm8 // 2), 2, f, f, f),
        RowConfig(tm16, 4, f, t, f, 0, True),   # layer norm: one-pass statistics
        RowConfig(tm8, 4, f, t, f, 0, True),
        RowConfig(tm16, 4, f, t, f, 8, True),
    ]
    third = [  # occupancy around the winner; layer norm's one-pass statistics in the persistent loop
        RowConfig(tm16, 3, f, t, f),
        RowConfig(tm16, 5, f, t, f),
        RowConfig(tm16, 6, f, t, f),
        RowConfig(tm16, 3, f, t, f, 0, True),
        RowConfig(tm16, 4, t, t, f, 0, True),
        RowConfig(tm32, 1, t, t, f, 8, True),
        RowConfig(tm32, 2, t, t, f, 0, True),
    ]
    # Round 4, layer norm vs rms norm gap (layer norm only). The sm_90 cubins (tileiras 13.4, JIT-like
    # signature, 8 rows x 1024 fp16, occupancy 4) give each compute thread ~1180 SASS instructions for the
    # one-pass layer norm (step 07) against ~780 for rms_norm step 05 (97.6 % of copy): per row two IEEE
    # divisions `/ n` (MUFU.RCP, FCHK, 4 FFMA, branch; in every thread), a second reduction, sub+mul+FMA per
    # element for the affine. cheap-stats: ~960; plus fma-affine: ~880. Then the layouts around the winners.
    fourth = [
        RowConfig(tm16, 4, f, t, f, 0, True),  # reference in the same run: round 2's one-pass config (step 07)
        RowConfig(tm16, 4, f, t, f, 0, True, True),
        RowConfig(tm16, 4, f, t, f, 0, True, True, True),
        RowConfig(tm16, 5, f, t, f, 0, True, True, True),  # 48 registers (24 B stack), 5 CTAs per SM
        RowConfig(tm16, 3, f, t, f, 8, True, True, True),  # 8 compute warps, 56 registers, 24 compute warps/SM
        RowConfig(tm32, 2, f, t, f, 8, True, True, True),  # 8 compute warps, 80 registers
        RowConfig(tm32, 2, f, t, f, 0, True, True, True),  # 4 compute warps, 128 registers
        RowConfig(tm32, 1, t, t, f, 8, True, True, True),  # step 08's TileGym persistent layout
    ]
    # Round 5, the last 1-3 % against torch.compile: the shipped best layouts (rms_norm step 05, layer_norm
    # step 11) with and without check_bounds=False on the row tiles (playbook entry N: not measured on the
    # H200 before), then half and double the rows per CTA without the checks.
    fifth = [
        RowConfig(tm16, 4, f, t, f),  # rms_norm step 05 (8 rows of 1024 fp16 per CTA)
        RowConfig(tm16, 4, f, t, f, bounds=False),
        RowConfig(tm8, 4, f, t, f, bounds=False),
        RowConfig(tm32, 2, f, t, f, bounds=False),
        RowConfig(tm16, 4, f, t, f, 0, True, True, True),  # layer_norm step 11
        RowConfig(tm16, 4, f, t, f, 0, True, True, True, bounds=False),
        RowConfig(tm8, 4, f, t, f, 0, True, True, True, bounds=False),
    ]
    chosen = {1: first, 2: second, 3: third, 4: fourth, 5: fifth}
    return [c for r, cs in chosen.items() if rounds is None or r in rounds for c in cs]


SWIGLU_ROUNDS = {1: [
    SwigluConfig(1, 1024, 0, False),  # the plain kernel
    SwigluConfig(1, 1024, 0, True),
    SwigluConfig(1, 2048, 0, True),
    SwigluConfig(1, 4096, 0, True),
    SwigluConfig(2, 2048, 0, True),
    SwigluConfig(4, 1024, 0, True),   # step 02's tiles
    SwigluConfig(1, 4096, 4, True),
    SwigluConfig(1, 2048, 0, False),
], 2: [
    SwigluConfig(1, 512, 0, True),
    SwigluConfig(1, 1024, 8, True),
    SwigluConfig(1, 1024, 16, True),
    SwigluConfig(1, 2048, 8, True),
    SwigluConfig(1, 1024, 4, True, True),
    SwigluConfig(2, 1024, 4, True, True),
    SwigluConfig(4, 1024, 4, True, True),
    SwigluConfig(4, 1024, 2, True, True),
    SwigluConfig(0, 1024, 0, True),
    SwigluConfig(0, 2048, 8, True),
], 3: [
    SwigluConfig(0, 512, 0, True),
    SwigluConfig(0, 2048, 0, True),
    SwigluConfig(0, 1024, 8, True),
    SwigluConfig(0, 1024, 16, True),
    SwigluConfig(0, 4096, 4, True),
    SwigluConfig(1, 512, 0, True),
    SwigluConfig(1, 1024, 8, True),
], 5: [  # step 06 against check_bounds=False and latency hints on its loads (playbook entry N)
    SwigluConfig(0, 1024, 0, True),
    SwigluConfig(0, 1024, 0, True, bounds=False),
    SwigluConfig(0, 2048, 0, True, bounds=False),
    SwigluConfig(0, 4096, 0, True, bounds=False),
    SwigluConfig(0, 1024, 0, True, latency=10),
    SwigluConfig(0, 1024, 0, True, bounds=False, latency=10),
    SwigluConfig(0, 1024, 8, True, bounds=False),
]}


def configs_for(case, rounds: set[int] | None = None) -> list:
    if case.module == "swiglu":
        return [c for r, cs in SWIGLU_ROUNDS.items() if rounds is None or r in rounds for c in cs]
    configs = row_configs(case.shape[-1] * torch.empty((), dtype=case.dtype).element_size(), rounds)
    return [c for c in configs if case.module == "layer_norm" or not (c.one_pass or c.cheap_stats or c.affine_fma)]


def function_for(case, cfg):
    return swiglu_function(cfg) if case.module == "swiglu" else row_function(case.module, cfg)


def _compile_config(job: tuple) -> str:
    """Worker: run one config once on small inputs so cuTile compiles it into its disk cache."""
    case, cfg = job
    try:
        function_for(case, cfg)(*kb.make_inputs(kb.small(case)))
        torch.cuda.synchronize()
        return ""
    except Exception as exc:
        return f"{case.kernel} {cfg.label()}: {kb._error(exc)}"


def sweep_case(case, budget: dict, copy_tbps: float, rounds: set[int] | None = None,
               with_compile: bool = False) -> list[dict]:
    inputs = kb.make_inputs(case)
    expected = kb.torch_reference(case)(*inputs)
    units = kb.work_units(case, inputs)
    configs = [(cfg.label(), function_for(case, cfg)) for cfg in configs_for(case, rounds)]
    if with_compile:  # torch.compile of the same reference, timed in the same run as the configs
        configs.append(("torch.compile (Inductor)", torch.compile(kb.torch_reference(case))))
    rows = []
    for label, fn in configs:
        row = {"case": f"{case.kernel} {'x'.join(map(str, case.shape))} {str(case.dtype).replace('torch.', '')}",
               "config": label, "ms": None, "pct": None, "note": ""}
        try:
            wrong = kb.check_close(fn(*inputs), expected)
        except Exception as exc:  # a config that does not compile is a result too
            wrong = kb._error(exc)
        if wrong:
            row["note"] = wrong
        else:
            ms, note = kb.try_time(lambda: fn(*inputs), budget)
            row.update(ms=ms, note=note)
            if ms is not None:
                row["pct"] = 100.0 * units / (ms * 1e-3) / 1e12 / copy_tbps
        print(f"  {row['case']}: {label}: {row['ms'] and round(row['ms'], 4)} ms {row['note']}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes and short budgets (smoke run)")
    parser.add_argument("--only", action="append", default=[], metavar="KERNEL",
                        help="run only cases whose kernel name starts with this (repeatable)")
    parser.add_argument("--precompile", type=int, default=0, metavar="N",
                        help="compile every config first in N processes (cuTile's disk cache)")
    parser.add_argument("--round", action="append", type=int, default=[], choices=(1, 2, 3, 4, 5),
                        help="only the configs of this sweep round (repeatable; default: all rounds)")
    parser.add_argument("--with-compile", action="store_true",
                        help="add a torch.compile row per case, timed in the same run")
    args = parser.parse_args(argv)
    rounds = set(args.round) or None
    if not torch.cuda.is_available():
        print("benchmarks/kernel_sweep.py needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 3
    budget = {"warmup_ms": 10.0, "rep_ms": 30.0, "max_reps": 200} if args.quick else {}
    cases = [c for c in (kb.QUICK_CASES if args.quick else kb.FULL_CASES) if c.kind == "memory"
             and (not args.only or any(c.kernel.startswith(o) for o in args.only))]
    jobs = [(case, cfg) for case in cases for cfg in configs_for(case, rounds)]
    for failure in kb.run_pool(_compile_config, jobs, args.precompile):
        if failure:
            print(f"precompile: {failure}", file=sys.stderr)
    copy_tbps = kb.copy_bandwidth_tbps(budget, args.quick)
    print(f"copy ceiling {copy_tbps:.3f} TB/s; times: median, cold L2, CUDA events (cutile_perf.bench)")
    for case in cases:
        rows = sweep_case(case, budget, copy_tbps, rounds, args.with_compile)
        for r in sorted(rows, key=lambda r: r["ms"] if r["ms"] is not None else float("inf")):
            ms = f"{r['ms']:.4f}" if r["ms"] is not None else "n/a"
            pct = f"{r['pct']:.1f} %" if r["pct"] is not None else ""
            print(f"{r['case']:32s} {r['config']:58s} {ms:>8s} {pct:>7s} {r['note']}")
        print(flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
