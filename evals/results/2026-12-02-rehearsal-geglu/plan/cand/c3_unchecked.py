# SPDX-FileCopyrightText: Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
#
# SPDX-License-Identifier: MIT

import operator
from functools import reduce

import cuda.tile as ct
import torch

from tilegym.backend import register_impl

from .gelu import gelu_forward_ct
from .gelu import gelu_tanh_forward_ct
from .gelu import standard_normal_cdf_ct
from .gelu import standard_normal_pdf_ct

# Approximation mode constants
GELU_EXACT = 0
GELU_TANH = 1


def _gelu_bwd_ct(x_val, dy_val, BLOCK_SIZE: ct.Constant[int]):
    """
    Compute GELU backward gradient: dy * (Φ(x) + x * φ(x))

    Args:
        x_val: Input value tile
        dy_val: Output gradient tile
        BLOCK_SIZE: Block size constant

    Returns:
        Gradient with respect to input
    """
    cdf_val = standard_normal_cdf_ct(x_val, BLOCK_SIZE)
    pdf_val = standard_normal_pdf_ct(x_val, BLOCK_SIZE)
    x_pdf = x_val * pdf_val
    grad_factor = cdf_val + x_pdf
    return dy_val * grad_factor



# GELU with the tanh form of Phi used by this module (both modes):
#   Phi(x) ~= 0.5 * (1 + tanh(z)) = sigmoid(2 z),  z = sqrt(2/pi) * (x + 0.044715 x^3)
#   sigmoid(2 z) = 1 / (1 + 2^(x * (K1 + K2 x^2)))
# computed in fp32 with exp2 (flush-to-zero) and an approximate division.
_LOG2E = 1.4426950408889634
_K1 = -2.0 * 0.7978845608028654 * _LOG2E
_K2 = _K1 * 0.044715
_NEG_HALF_LOG2E = -0.5 * _LOG2E
_INV_SQRT_2PI = 0.3989422804014327


def _phi_denom(bf):
    return 1.0 + ct.exp2(bf * (_K1 + _K2 * (bf * bf)), flush_to_zero=True)


def _fast_div(num, den):
    return ct.truediv(num, den, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)


# Elements per CTA: a (TM, TN) block of the (M, N2) output. 1024 elements per CTA was the best
# flat tile of the closely related SwiGLU on H200.
ELEMS_PER_CTA = 1024


def _next_pow2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


def _tile_shape(N2):
    TN = min(_next_pow2(N2), ELEMS_PER_CTA)
    TM = max(1, ELEMS_PER_CTA // TN)
    return TM, TN


def _needs_check(M, N2, TM, TN):
    # Bounds checks only when an edge tile is partial; whole tiles run unchecked.
    return (M % TM != 0) or (N2 % TN != 0)


def _split_dims(x_shape, dim):
    # x (contiguous) seen as (M, 2, N2): [:, 0, :] is the left half a, [:, 1, :] the right half b.
    M = reduce(operator.mul, x_shape[:dim], 1)
    N2 = reduce(operator.mul, x_shape[dim:], 1) // 2
    return M, N2


@ct.kernel
def _geglu_fwd_kernel(
    y,
    x,
    N_TILES: ct.Constant[int],
    TM: ct.Constant[int],
    TN: ct.Constant[int],
    APPROXIMATE: ct.Constant[int],
    CHECK: ct.Constant[bool],
):
    """
    Forward kernel for GEGLU activation.

    x is viewed as (M, 2, N2) and y as (M, N2). Computes: y = a * GELU(b)
    where a = x[:, 0, :] (left half) and b = x[:, 1, :] (right half).
    """
    bid = ct.bid(0)
    bm = bid // N_TILES
    bn = bid % N_TILES

    a = ct.astype(ct.load(x, (bm, 0, bn), (TM, 1, TN), check_bounds=CHECK), ct.float32)
    b = ct.astype(ct.load(x, (bm, 1, bn), (TM, 1, TN), check_bounds=CHECK), ct.float32)

    # a * GELU(b); GELU_EXACT and GELU_TANH use the same tanh form of Phi in this module
    geglu_output = a * _fast_div(b, _phi_denom(b))

    ct.store(y, (bm, bn), ct.reshape(ct.astype(geglu_output, y.dtype), (TM, TN)), check_bounds=CHECK)


@ct.kernel
def _geglu_bwd_kernel(
    dx,
    dy,
    x,
    N_TILES: ct.Constant[int],
    TM: ct.Constant[int],
    TN: ct.Constant[int],
    APPROXIMATE: ct.Constant[int],
    CHECK: ct.Constant[bool],
):
    """
    Backward kernel for GEGLU activation (x, dx viewed as (M, 2, N2), dy as (M, N2)).

    Computes gradients with respect to a and b:
    - da = dy * GELU(b)
    - db = dy * a * GELU'(b)
    """
    bid = ct.bid(0)
    bm = bid // N_TILES
    bn = bid % N_TILES

    a = ct.astype(ct.load(x, (bm, 0, bn), (TM, 1, TN), check_bounds=CHECK), ct.float32)
    b = ct.astype(ct.load(x, (bm, 1, bn), (TM, 1, TN), check_bounds=CHECK), ct.float32)
    dy_val = ct.reshape(ct.astype(ct.load(dy, (bm, bn), (TM, TN), check_bounds=CHECK), ct.float32), (TM, 1, TN))

    # cdf = Phi(b) (tanh form), pdf = phi(b) = exp(-b^2 / 2) / sqrt(2 pi)
    cdf = _fast_div(1.0, _phi_denom(b))
    pdf = _INV_SQRT_2PI * ct.exp2((b * b) * _NEG_HALF_LOG2E, flush_to_zero=True)

    # da = dy * GELU(b), db = dy * a * (Phi(b) + b * phi(b))
    da = dy_val * (b * cdf)
    db = (dy_val * a) * (cdf + b * pdf)

    ct.store(dx, (bm, 0, bn), ct.astype(da, dx.dtype), check_bounds=CHECK)
    ct.store(dx, (bm, 1, bn), ct.astype(db, dx.dtype), check_bounds=CHECK)


class _GEGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, approximate):
        assert approximate == "none" or approximate == "tanh", "Only `none` or `tanh` activations are supported"
        assert x.is_contiguous()
        assert x.shape[dim] % 2 == 0

        x_shape = x.shape
        dim = dim % len(x_shape)
        y_shape = list(x_shape)
        y_shape[dim] = y_shape[dim] // 2

        M, N2 = _split_dims(x_shape, dim)
        x3 = x.view(M, 2, N2)
        y = torch.empty(y_shape, device=x.device, dtype=x.dtype)
        y2 = y.view(M, N2)

        TM, TN = _tile_shape(N2)
        n_tiles = (N2 + TN - 1) // TN
        grid = (((M + TM - 1) // TM) * n_tiles, 1, 1)
        approximate_mode = GELU_TANH if approximate == "tanh" else GELU_EXACT

        ct.launch(
            torch.cuda.current_stream(),
            grid,
            _geglu_fwd_kernel,
            (y2, x3, n_tiles, TM, TN, approximate_mode, _needs_check(M, N2, TM, TN)),
        )

        ctx.save_for_backward(x)
        ctx.dim = dim
        ctx.approximate = approximate
        return y

    @staticmethod
    def backward(ctx, dy):
        dy = dy.contiguous()
        (x,) = ctx.saved_tensors
        dim = ctx.dim
        approximate = ctx.approximate

        M, N2 = _split_dims(x.shape, dim)
        x3 = x.view(M, 2, N2)
        dy2 = dy.view(M, N2)
        dx = torch.empty_like(x)
        dx3 = dx.view(M, 2, N2)

        TM, TN = _tile_shape(N2)
        n_tiles = (N2 + TN - 1) // TN
        grid = (((M + TM - 1) // TM) * n_tiles, 1, 1)
        approximate_mode = GELU_TANH if approximate == "tanh" else GELU_EXACT

        ct.launch(
            torch.cuda.current_stream(),
            grid,
            _geglu_bwd_kernel,
            (dx3, dy2, x3, n_tiles, TM, TN, approximate_mode, _needs_check(M, N2, TM, TN)),
        )

        return dx, None, None


@register_impl("geglu", backend="cutile")
def geglu(input: torch.Tensor, dim=-1, approximate="none"):
    r"""
    Returns GEGLU activation of input.
    $f(x) = a \otimes GELU(b)$
    Where $a$ is the first half of the input matrices and $b$ is the second half.
    ```dim``` is the dimension on which to split the input.
    If approximate is ``'tanh'`` then
    $GELU(x) = 0.5 * x * (1 + \text{Tanh}(\sqrt(2 / \pi) * (x + 0.044715 * x^3)))$
    Else if approximate is ``'none'`` then
    $GELU(x) = x * \Phi(x)$
    Where $Phi(x)$ is the Cumulative Distribution Function for Gaussian Distribution.
    Args:
        input: Tensor
        dim: int
        approximate: ``'none'`` or ``'tanh'``
    """
    return _GEGLU.apply(input, dim, approximate)
