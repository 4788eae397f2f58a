"""Dense matmul C = A @ B on tensor cores (cuTile), fp16/bf16 in, fp32 accumulate.

Step 07: two consumer warpgroups on 128x256 tiles (builds on step 03; steps 04-06 are not in
it). One change of config, four knobs together: the best of benchmarks/matmul_sweep.py on the
H200 (benchmarks/results/2026-12-02-h200/issue22/matmul_sweep.md). 128x256x64 tiles,
``num_worker_warps=8`` (two warpgroups on the MMA, each holding a 64x256 half of the fp32
accumulator in registers: 168 registers per thread, no stack on sm_90), occupancy 1 (one
209 KB CTA per SM), grouped order GROUP_M=8 as before, and ``latency=10`` on both operand
loads. With the default 4 worker warps the 128x256 accumulator does not fit and the cubin
spills (the probe's 13.8x slower config). Compiles to
the same sm_90 SASS as the sweep's ``128x256x64 occ1 w8 g8 lat10`` (tests/test_matmul_sweep.py).
Correct for any M, N, K: zero-padded edge tiles, out-of-range stores dropped.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import current_stream

ConstInt = ct.Constant[int]

TILE_M = 128
TILE_N = 256
TILE_K = 64
GROUP_M = 8  # tile-rows per band of the grouped order
OCCUPANCY = 1  # CTAs per SM the compiler sizes registers and shared memory for
WORKER_WARPS = 8  # num_worker_warps: two consumer warpgroups, each with half the accumulator
LATENCY = 10  # latency= hint on both operand loads (1..10); other SASS than no hint at the same 209 KB

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def grouped_tile(tile_id, M, N, TM, TN, GROUP):
    """(tile row, tile col) of the tile_id-th output tile in grouped order (a bijection).

    Tiles are numbered down each band of GROUP tile-rows, column by column; the last band may
    be shorter when the number of tile-rows is not a multiple of GROUP.
    """
    tiles_m = ct.cdiv(M, TM)
    tiles_per_band = GROUP * ct.cdiv(N, TN)
    first_row = (tile_id // tiles_per_band) * GROUP
    band_rows = min(tiles_m - first_row, GROUP)
    in_band = tile_id % tiles_per_band
    return first_row + in_band % band_rows, in_band // band_rows


@ct.kernel(occupancy=OCCUPANCY, num_worker_warps=WORKER_WARPS)
def matmul_kernel(A, B, C, TM: ConstInt, TN: ConstInt, TK: ConstInt, GROUP: ConstInt):
    bid_m, bid_n = grouped_tile(ct.bid(0), A.shape[0], B.shape[1], TM, TN, GROUP)
    # Number of K tiles, rounded up: the last one may be partial and is zero-padded.
    num_k_tiles = ct.num_tiles(A, axis=1, shape=(TM, TK))
    acc = ct.full((TM, TN), 0.0, dtype=ct.float32)
    for k in range(num_k_tiles):
        a = ct.load(A, index=(bid_m, k), shape=(TM, TK), padding_mode=ct.PaddingMode.ZERO,
                    latency=LATENCY)
        b = ct.load(B, index=(k, bid_n), shape=(TK, TN), padding_mode=ct.PaddingMode.ZERO,
                    latency=LATENCY)
        acc = ct.mma(a, b, acc)
    ct.store(C, index=(bid_m, bid_n), tile=acc.astype(C.dtype))


def _check_inputs(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul expects 2-D a and b, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.dtype not in SUPPORTED_DTYPES or b.dtype != a.dtype:
        raise TypeError(f"matmul supports fp16/bf16 with equal dtypes, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"a and b are on different devices: {a.device} and {b.device}")


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Return a @ b for 2-D fp16/bf16 tensors (fp32 accumulation, output in the input dtype)."""
    _check_inputs(a, b)
    c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    if a.shape[1] == 0:
        return c.zero_()
    grid = (ct.cdiv(c.shape[0], TILE_M) * ct.cdiv(c.shape[1], TILE_N), 1, 1)
    ct.launch(current_stream(), grid, matmul_kernel, (a, b, c, TILE_M, TILE_N, TILE_K, GROUP_M))
    return c


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    return [(matmul_kernel, [signature([contiguous(dt, 2), contiguous(dt, 2), contiguous(dt, 2),
                                        TILE_M, TILE_N, TILE_K, GROUP_M])
                             for dt in (ct.bfloat16,)])]  # fp16 takes the same path
