"""Dense matmul C = A @ B on tensor cores (cuTile), fp16/bf16 in, fp32 accumulate.

Step 05 (expected SLOWER on H200): Blackwell-style 256x256x64 tiles on a 2-CTA cluster
(num_ctas=2), on top of steps 01-04. This is the shape of config that pays off on B200, where
the MMA accumulator lives in tensor memory and a CTA pair shares operand tiles. On Hopper the
fp32 accumulator must live in registers: each CTA of the pair holds a 128x256 fp32 slice, and
the sm_90 cubin spills heavily inside the K loop (the sm_100 cubin of the same source does
not; both checked by compiling on a CPU). Measured on an H200: this file ran at 6.1-6.9 % of
cuBLAS, about 14x slower than step 03 (13.5-14.2x per shape), and the probe measured
256x256x64 num_ctas=2 without the persistent grid 13.7x slower than 128x128x64. Kept as the
negative example the loop must revert. `num_ctas=ct.ByTarget(sm_100=2)` would silently do nothing on sm_90, so the hint is a
plain integer to make the H200 actually run the cluster.
Correct for any M, N, K: zero-padded edge tiles, out-of-range stores dropped.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import current_stream, sm_count

ConstInt = ct.Constant[int]

TILE_M = 256
TILE_N = 256
TILE_K = 64
GROUP_M = 8  # tile-rows per band of the grouped order
OCCUPANCY = 2  # CTAs per SM the compiler sizes registers and shared memory for
NUM_CTAS = 2  # CTAs per cluster: the pair splits each 256x256 tile

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


@ct.kernel(occupancy=OCCUPANCY, num_ctas=NUM_CTAS)
def matmul_kernel(A, B, C, TM: ConstInt, TN: ConstInt, TK: ConstInt, GROUP: ConstInt):
    num_tiles = ct.cdiv(A.shape[0], TM) * ct.cdiv(B.shape[1], TN)
    # Number of K tiles, rounded up: the last one may be partial and is zero-padded.
    num_k_tiles = ct.num_tiles(A, axis=1, shape=(TM, TK))
    for tile_id in range(ct.bid(0), num_tiles, ct.num_blocks(0)):
        bid_m, bid_n = grouped_tile(tile_id, A.shape[0], B.shape[1], TM, TN, GROUP)
        acc = ct.full((TM, TN), 0.0, dtype=ct.float32)
        for k in range(num_k_tiles):
            a = ct.load(A, index=(bid_m, k), shape=(TM, TK), padding_mode=ct.PaddingMode.ZERO)
            b = ct.load(B, index=(k, bid_n), shape=(TK, TN), padding_mode=ct.PaddingMode.ZERO)
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
    num_tiles = ct.cdiv(c.shape[0], TILE_M) * ct.cdiv(c.shape[1], TILE_N)
    grid = (min(num_tiles, sm_count(c.device.index) * OCCUPANCY), 1, 1)
    ct.launch(current_stream(), grid, matmul_kernel, (a, b, c, TILE_M, TILE_N, TILE_K, GROUP_M))
    return c


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    return [(matmul_kernel, [signature([contiguous(dt, 2), contiguous(dt, 2), contiguous(dt, 2),
                                        TILE_M, TILE_N, TILE_K, GROUP_M])
                             for dt in (ct.bfloat16,)])]  # fp16 takes the same path
