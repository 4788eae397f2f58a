"""Fused multi-head attention forward (flash-attention style), cuTile.

``fmha(q, k, v, causal=..., scale=None)`` with q, k, v of shape (B, H, S, D), fp16/bf16,
D in {64, 128}. Each block owns TILE_M query rows of one (batch, head) and streams the keys
and values in TILE_N-row tiles with an online softmax (running max, running denominator,
fp32 accumulator), so the S x S score matrix never exists.

Step 05: longest causal blocks first (on top of steps 01-04). With causal masking, query
block i does i+1 key tiles of work, so the blocks launched last (highest i) are the longest
and the GPU idles at the end while a few of them finish. Numbering the query blocks in
reverse makes the scheduler start the long blocks first and fill the tail with short ones
(longest-processing-time-first). Non-causal attention is unchanged (the branch is resolved
at compile time).

Masking rules that keep the math finite (unchanged from the plain version): K and V tails
are loaded zero-padded; masked scores are *selected* to -inf; every real query row sees key
0 in the first key tile, so its running max is finite from the first step on. Query rows
past the end of the sequence compute garbage that the store drops.
"""
from __future__ import annotations

import math

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import current_stream

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

LOG2_E = 1.4426950408889634  # exp(x) == exp2(x * LOG2_E)

# (query rows per block, key/value rows per inner step) by head dim: the largest tiles that do
# not spill on sm_90.
TILES_BY_HEAD_DIM = {64: (128, 128), 128: (128, 64)}
K_LATENCY = 2  # load latency hints, 1 (light DRAM traffic) .. 10 (heavy)
V_LATENCY = 4

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_HEAD_DIMS = (64, 128)


@ct.kernel
def fmha_kernel(Q, K, V, Out, qk_scale_log2: float, num_heads: int,
                HEAD_DIM: ConstInt, TM: ConstInt, TN: ConstInt, CAUSAL: ConstBool):
    m_blk = ct.bid(0)
    if CAUSAL:
        m_blk = ct.num_blocks(0) - 1 - m_blk  # heaviest query blocks are scheduled first
    batch = ct.bid(1) // num_heads
    head = ct.bid(1) % num_heads
    seq_len_k = K.shape[2]

    q = ct.load(Q, index=(batch, head, m_blk, 0), shape=(1, 1, TM, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TM, HEAD_DIM))

    rows = (m_blk * TM + ct.arange(TM, dtype=ct.int32))[:, None]  # [TM, 1] query positions
    tile_cols = ct.arange(TN, dtype=ct.int32)[None, :]  # [1, TN]

    # m_i is kept in log2 units of the scaled scores: m_i = max_j(s_ij) * scale * log2(e).
    m_i = ct.full((TM, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TM, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TM, HEAD_DIM), 0.0, dtype=ct.float32)

    if CAUSAL:
        # Keys up to the block's last query row; rows past the sequence end need nothing more.
        num_kv_tiles = ct.cdiv(min((m_blk + 1) * TM, seq_len_k), TN)
        # Tiles whose last key <= the block's first query row are fully visible to every row.
        num_unmasked = min(m_blk * TM + 1, seq_len_k) // TN
    else:
        num_kv_tiles = ct.cdiv(seq_len_k, TN)
        num_unmasked = seq_len_k // TN

    for j in range(num_kv_tiles):
        # K^T tile [HEAD_DIM, TN]: view K with its last two axes swapped.
        k_t = ct.load(K, index=(batch, head, 0, j), shape=(1, 1, HEAD_DIM, TN), order=(0, 1, 3, 2),
                      padding_mode=ct.PaddingMode.ZERO, latency=K_LATENCY).reshape((HEAD_DIM, TN))
        s = ct.mma(q, k_t, ct.full((TM, TN), 0.0, dtype=ct.float32))  # raw, unscaled scores

        if j >= num_unmasked:  # diagonal tile or sequence tail
            cols = j * TN + tile_cols
            keep = cols < seq_len_k
            if CAUSAL:
                keep = keep & (cols <= rows)
            s = ct.where(keep, s, -math.inf)

        m_new = ct.maximum(m_i, ct.max(s, axis=1, keepdims=True) * qk_scale_log2)
        p = ct.exp2(s * qk_scale_log2 - m_new, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p, axis=1, keepdims=True)

        v = ct.load(V, index=(batch, head, j, 0), shape=(1, 1, TN, HEAD_DIM),
                    padding_mode=ct.PaddingMode.ZERO, latency=V_LATENCY).reshape((TN, HEAD_DIM))
        acc = ct.mma(p.astype(Q.dtype), v, acc * alpha)
        m_i = m_new

    out = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    ct.store(Out, index=(batch, head, m_blk, 0), tile=out.astype(Out.dtype).reshape((1, 1, TM, HEAD_DIM)))


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"fmha expects q, k, v of equal shape (B, H, S, D), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[3] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim must be one of {SUPPORTED_HEAD_DIMS}, got {q.shape[3]}")
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"fmha supports fp16/bf16 with equal dtypes, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError("q, k and v must be on the same device")


def _check_scale(scale: float) -> None:
    # The optimized versions take the row max of unscaled scores; that equals the max of scaled
    # scores only for a positive scale, so every version refuses the others.
    if not scale > 0:
        raise ValueError(f"scale must be a positive number, got {scale}")


def fmha(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
         scale: float | None = None) -> torch.Tensor:
    """softmax(q @ k^T * scale [+ causal mask]) @ v; ``scale`` defaults to 1/sqrt(D).

    The causal mask is top-left aligned (query i sees keys 0..i), as in
    ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``.
    """
    _check_inputs(q, k, v)
    batch, heads, seq_len, head_dim = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    _check_scale(scale)
    out = torch.empty_like(q)
    if out.numel() == 0:
        return out
    tile_m, tile_n = TILES_BY_HEAD_DIM[head_dim]
    grid = (ct.cdiv(seq_len, tile_m), batch * heads, 1)
    ct.launch(current_stream(), grid, fmha_kernel,
              (q, k, v, out, float(scale) * LOG2_E, heads, head_dim, tile_m, tile_n, bool(causal)))
    return out


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py).

    Two signatures cover both head dims, both dtypes and both mask modes (fp16/bf16 take the same
    code path); every combination would quadruple CI compile time for little extra coverage.
    """
    from tilesuite.aot import contiguous, scalar, signature

    sigs = [signature([contiguous(dt, 4), contiguous(dt, 4), contiguous(dt, 4), contiguous(dt, 4),
                       scalar(ct.float32), scalar(ct.int32), head_dim, *TILES_BY_HEAD_DIM[head_dim], causal])
            for dt, head_dim, causal in ((ct.float16, 64, True), (ct.bfloat16, 128, False))]
    return [(fmha_kernel, sigs)]
