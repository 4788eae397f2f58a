"""Dense matmul C = A @ B on tensor cores (cuTile), fp16/bf16 in, fp32 accumulate.

Step 06: autotuning (on top of step 03; steps 04 and 05 were reverted on the H200, so this
file does not contain them). The kernel is step 03's: Hopper tiles, grouped tile order and
the occupancy-2 hint. What changes is the host side: the tile sizes, occupancy and num_ctas
are chosen per problem size by ``cutile_perf.tune.Autotuner`` from the measured search space of
the device's architecture (``cutile_perf.tune.spaces.matmul_space``; on sm_90 the H200 probe's
best configs), tuned once per (pow2-bucketed M, N, K, dtype), cached on disk, and launched with
a dict lookup afterwards. Step 03's config (128x128x64, occupancy 2) is the fixed config: it is
always in the space, timed first, and is what ``DISABLE_AUTOTUNE=1`` launches.
Correct for any M, N, K and any config: zero-padded edge tiles, out-of-range stores dropped.
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from cutile_perf.tune import Autotuner, Config, pow2_bucket
from cutile_perf.tune.keys import detect_device
from cutile_perf.tune.spaces import matmul_space
from tilesuite.ops.cutile._host import current_stream

ConstInt = ct.Constant[int]

TILE_M = 128
TILE_N = 128
TILE_K = 64
GROUP_M = 8  # tile-rows per band of the grouped order
OCCUPANCY = 2  # CTAs per SM the compiler sizes registers and shared memory for
# Step 03's config: launched when autotuning is disabled, and the one tuning has to beat.
FIXED = Config(TILE_M=TILE_M, TILE_N=TILE_N, TILE_K=TILE_K, occupancy=OCCUPANCY, num_ctas=1)

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


@ct.kernel(occupancy=OCCUPANCY)
def matmul_kernel(A, B, C, TM: ConstInt, TN: ConstInt, TK: ConstInt, GROUP: ConstInt):
    bid_m, bid_n = grouped_tile(ct.bid(0), A.shape[0], B.shape[1], TM, TN, GROUP)
    # Number of K tiles, rounded up: the last one may be partial and is zero-padded.
    num_k_tiles = ct.num_tiles(A, axis=1, shape=(TM, TK))
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


def make_tuner(sm_arch: str) -> Autotuner:
    """The tuner for one architecture: its measured matmul space, step 03's config included."""
    return Autotuner(matmul_kernel, [FIXED, *matmul_space(sm_arch)], fixed=FIXED, name="tilesuite_matmul")


_TUNERS: dict[int, Autotuner] = {}  # per device index: one tuner, one in-memory cache


def _tuner(device: torch.device) -> Autotuner:
    index = device.index if device.index is not None else torch.cuda.current_device()
    tuner = _TUNERS.get(index)
    if tuner is None:
        tuner = _TUNERS[index] = make_tuner(detect_device(index).sm_arch)
    return tuner


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Return a @ b for 2-D fp16/bf16 tensors (fp32 accumulation, output in the input dtype)."""
    _check_inputs(a, b)
    c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    if a.shape[1] == 0:
        return c.zero_()
    m, k = a.shape
    n = b.shape[1]
    # Nearby sizes share one tuning (the grid below still uses the exact sizes). The search
    # launches write only into c, which the final launch overwrites: no scratch copy needed.
    key = (pow2_bucket(m), pow2_bucket(n), pow2_bucket(k), a.dtype)
    _tuner(a.device).launch(current_stream(), key,
                            lambda cfg: (ct.cdiv(m, cfg.TILE_M) * ct.cdiv(n, cfg.TILE_N), 1, 1),
                            lambda cfg: (a, b, c, cfg.TILE_M, cfg.TILE_N, cfg.TILE_K, GROUP_M))
    return c


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    # The fixed config's hinted kernel: exactly what DISABLE_AUTOTUNE=1 launches.
    kernel = make_tuner("sm_90").kernel_for(FIXED)
    return [(kernel, [signature([contiguous(dt, 2), contiguous(dt, 2), contiguous(dt, 2),
                                 TILE_M, TILE_N, TILE_K, GROUP_M])
                      for dt in (ct.bfloat16,)])]  # fp16 takes the same path
