"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(d) Silently lower precision. The same two-pass kernel with the row maximum, the exponentials and
the running sum kept in the input's dtype (fp16/bf16) instead of fp32. The ordinary tolerances
(1e-2, 5e-2 absolute) accept it; it may or may not be faster, and "within noise" would be kept.
Defence: the float64 reference, compared ulp by ulp: 20-80 % of elements are off by one or more
ulps (a fp32-accumulating kernel: ~0.01 %).
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream

TILE_N = 1024  # columns per loop step


@ct.kernel
def softmax_kernel(x, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    num_col_tiles = ct.num_tiles(x, axis=1, shape=(1, TILE_N))
    run_max = ct.full((1, 1), float("-inf"), dtype=x.dtype)  # the accumulators in the input's precision
    run_sum = ct.full((1, 1), 0.0, dtype=x.dtype)
    for j in range(num_col_tiles):
        t = ct.load(x, (row, j), (1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF)  # no fp32 upcast
        new_max = ct.maximum(run_max, ct.max(t, axis=1, keepdims=True))
        run_sum = run_sum * ct.exp(run_max - new_max) + ct.sum(ct.exp(t - new_max), axis=1, keepdims=True)
        run_max = new_max
    for j in range(num_col_tiles):
        t = ct.load(x, (row, j), (1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF)
        ct.store(out, (row, j), ct.astype(ct.exp(t - run_max) / run_sum, out.dtype))


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    rows = as_rows(x)
    out = torch.empty_like(rows)
    ct.launch(current_stream(), (rows.shape[0],), softmax_kernel, (rows, out, TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    half = [contiguous(dtype, 2) for dtype in (ct.float16, ct.bfloat16)]
    return [(softmax_kernel, [signature([arr, arr, TILE_N]) for arr in half])]
