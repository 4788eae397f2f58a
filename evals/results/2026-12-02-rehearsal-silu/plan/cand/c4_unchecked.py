# SPDX-FileCopyrightText: Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
#
# SPDX-License-Identifier: MIT

import functools

import cuda.tile as ct
import torch
from cuda.tile import RoundingMode as RMd

from tilegym.backend import register_impl
from tilegym.experimental import experimental_kernel

from .utils import next_power_of_2

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

# Elements of the output handled by one CTA (TILE_M rows x TILE_N columns).
# Small, fixed-size tiles keep registers low and give many short CTAs, which is
# what an elementwise, memory-bound kernel wants; one CTA per (padded) row was
# register-heavy for long rows and wasted work on rows that are not a power of 2.
_TILE_ELEMS = 1024


# Layout used by both kernels: the (..., 2*H) input is viewed as (M, 2, H), so
# input[:, 0, :] is the SiLU half ("a") and input[:, 1, :] the gate half ("b").
# Outputs are viewed as (M, 1, H) (forward, grad_output) or (M, 2, H) (grad_input),
# so every access is a tiled ct.load/ct.store of a (TILE_M, 1, TILE_N) block.
# The grid is 1-D over (row tile, column tile), column tiles fastest, so
# neighbouring CTAs touch neighbouring memory.
@ct.kernel
def _silu_and_mul_fwd_kernel(
    input,  # (M, 2, H)
    output,  # (M, 1, H)
    TILE_M: ConstInt,
    TILE_N: ConstInt,
    NUM_N_TILES: ConstInt,
    CHECK: ConstBool,
):
    bid = ct.bid(0)
    bm = bid // NUM_N_TILES
    bn = bid % NUM_N_TILES

    a = ct.load(input, (bm, 0, bn), (TILE_M, 1, TILE_N), check_bounds=CHECK)
    b = ct.load(input, (bm, 1, bn), (TILE_M, 1, TILE_N), check_bounds=CHECK)
    a = ct.astype(a, torch.float32)
    b = ct.astype(b, torch.float32)

    # sigmoid(a) = 1 / (1 + 2^(-a * log2(e))), fast exp2 and approximate reciprocal
    e = ct.exp2(a * -1.4426950408889634, flush_to_zero=True)
    sigmoid_a = ct.truediv(1.0, 1.0 + e, flush_to_zero=True, rounding_mode=RMd.APPROX)

    result = (a * sigmoid_a) * b
    ct.store(output, (bm, 0, bn), ct.astype(result, output.dtype), check_bounds=CHECK)


# Backward kernel for silu_and_mul
# Computes gradients using recomputation (no saved activations)
# Forward: c = silu(a) * b = a * sigmoid(a) * b
# da = dc * b * (sigmoid(a) + a * sigmoid(a) * (1 - sigmoid(a)))
#    = dc * b * sigmoid(a) * (1 + a * (1 - sigmoid(a)))
# db = dc * silu(a)
# Both gradients are written straight into grad_input (M, 2, H), so no torch.cat
# is needed afterwards.
@experimental_kernel
@ct.kernel
def _silu_and_mul_bwd_kernel(
    grad_output,  # dc: (M, 1, H)
    input,  # (M, 2, H)
    grad_input,  # (M, 2, H): [:, 0, :] = da, [:, 1, :] = db
    TILE_M: ConstInt,
    TILE_N: ConstInt,
    NUM_N_TILES: ConstInt,
    CHECK: ConstBool,
):
    bid = ct.bid(0)
    bm = bid // NUM_N_TILES
    bn = bid % NUM_N_TILES

    dc = ct.load(grad_output, (bm, 0, bn), (TILE_M, 1, TILE_N), check_bounds=CHECK)
    a = ct.load(input, (bm, 0, bn), (TILE_M, 1, TILE_N), check_bounds=CHECK)
    b = ct.load(input, (bm, 1, bn), (TILE_M, 1, TILE_N), check_bounds=CHECK)
    dc = ct.astype(dc, torch.float32)
    a = ct.astype(a, torch.float32)
    b = ct.astype(b, torch.float32)

    e = ct.exp2(a * -1.4426950408889634, flush_to_zero=True)
    sigmoid_a = ct.truediv(1.0, 1.0 + e, flush_to_zero=True, rounding_mode=RMd.APPROX)
    silu_a = a * sigmoid_a

    db = dc * silu_a
    # silu'(a) = sigmoid(a) + silu(a) * (1 - sigmoid(a))
    silu_grad = sigmoid_a + silu_a * (1.0 - sigmoid_a)
    da = dc * (b * silu_grad)

    ct.store(grad_input, (bm, 0, bn), ct.astype(da, grad_input.dtype), check_bounds=CHECK)
    ct.store(grad_input, (bm, 1, bn), ct.astype(db, grad_input.dtype), check_bounds=CHECK)


def _tile_config(num_rows: int, hidden_size: int):
    """(TILE_M, TILE_N, NUM_N_TILES, CHECK, grid) for a (num_rows, hidden_size) output."""
    tile_n = min(next_power_of_2(hidden_size), _TILE_ELEMS)
    tile_m = max(1, _TILE_ELEMS // tile_n)
    tile_m = min(tile_m, next_power_of_2(num_rows))
    num_n_tiles = (hidden_size + tile_n - 1) // tile_n
    num_m_tiles = (num_rows + tile_m - 1) // tile_m
    # Bounds checks only where a tile can stick out of the array.
    check = (hidden_size % tile_n != 0) or (num_rows % tile_m != 0)
    grid = (num_m_tiles * num_n_tiles,)
    return tile_m, tile_n, num_n_tiles, check, grid


def _launch_forward(input_flat: torch.Tensor, output: torch.Tensor, hidden_size: int) -> None:
    """input_flat: contiguous (M, 2*H); output: contiguous (M, H)."""
    num_rows = input_flat.shape[0]
    if num_rows == 0 or hidden_size == 0:
        return
    tile_m, tile_n, num_n_tiles, check, grid = _tile_config(num_rows, hidden_size)
    ct.launch(
        torch.cuda.current_stream(),
        grid,
        _silu_and_mul_fwd_kernel,
        (
            input_flat.view(num_rows, 2, hidden_size),
            output.view(num_rows, 1, hidden_size),
            tile_m,
            tile_n,
            num_n_tiles,
            check,
        ),
    )


def _ensure_contiguous(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        def maybe_to_contiguous(x):
            return x.contiguous() if isinstance(x, torch.Tensor) else x

        args = [maybe_to_contiguous(arg) for arg in args]
        kwargs = {k: maybe_to_contiguous(v) for k, v in kwargs.items()}
        return fn(*args, **kwargs)

    return wrapper


def _silu_and_mul_backward_fused(
    grad_output: torch.Tensor,
    input: torch.Tensor,
) -> torch.Tensor:
    """
    Backward pass for fused SiLU and Mul operation, written in the input's layout.

    Args:
        grad_output: Gradient w.r.t. output, shape (..., hidden_size)
        input: Original input tensor, shape (..., 2*hidden_size)

    Returns:
        grad_input with the shape of input: [..., :hidden_size] = grad_a, [..., hidden_size:] = grad_b
    """
    hidden_size = grad_output.shape[-1]
    grad_output_flat = grad_output.contiguous().view(-1, hidden_size)
    input_flat = input.contiguous().view(-1, input.shape[-1])
    num_rows = input_flat.shape[0]
    grad_input = torch.empty(input_flat.shape, dtype=input.dtype, device=input.device)

    if num_rows > 0 and hidden_size > 0:
        tile_m, tile_n, num_n_tiles, check, grid = _tile_config(num_rows, hidden_size)
        ct.launch(
            torch.cuda.current_stream(),
            grid,
            _silu_and_mul_bwd_kernel,
            (
                grad_output_flat.view(num_rows, 1, hidden_size),
                input_flat.view(num_rows, 2, hidden_size),
                grad_input.view(num_rows, 2, hidden_size),
                tile_m,
                tile_n,
                num_n_tiles,
                check,
            ),
        )
    return grad_input.view(input.shape)


def _silu_and_mul_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Backward pass for fused SiLU and Mul operation.

    Args:
        grad_output: Gradient w.r.t. output, shape (..., hidden_size)
        input: Original input tensor, shape (..., 2*hidden_size)

    Returns:
        Tuple of (grad_a, grad_b) each with shape (..., hidden_size)
        (views into one (..., 2*hidden_size) gradient buffer)
    """
    hidden_size = grad_output.shape[-1]
    grad_input = _silu_and_mul_backward_fused(grad_output, input)
    return grad_input[..., :hidden_size], grad_input[..., hidden_size:]


class _SiLUAndMulFunction(torch.autograd.Function):
    """Autograd function for silu_and_mul with backward support."""

    @staticmethod
    def forward(ctx, input: torch.Tensor):
        # Save input for backward (used in recomputation)
        ctx.save_for_backward(input)

        original_shape = input.shape
        hidden_size = original_shape[-1] // 2

        input_flat = input.view(-1, original_shape[-1])
        batch_size = input_flat.shape[0]
        output = torch.empty(
            (batch_size, hidden_size),
            dtype=input.dtype,
            device=input.device,
        )
        _launch_forward(input_flat, output, hidden_size)

        output_shape = list(original_shape)
        output_shape[-1] = hidden_size
        return output.view(*output_shape)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        # da and db go straight into the input-shaped gradient (no torch.cat)
        return _silu_and_mul_backward_fused(grad_output, input)


@register_impl("silu_and_mul", backend="cutile")
@_ensure_contiguous
def silu_and_mul(
    input: torch.Tensor,
    out: torch.Tensor = None,
) -> torch.Tensor:
    """
    Fused SiLU and Mul operation implemented with Cutile.

    Computes: silu(input[..., :hidden_size]) * input[..., hidden_size:]

    Args:
        input (torch.Tensor): Input tensor of shape (..., 2 * hidden_size)
        out (Optional[torch.Tensor]): Output tensor, if specified kernel will update in-place
    Returns:
        torch.Tensor: Output tensor of shape (..., hidden_size)
    """
    # Use autograd wrapper when backward is needed
    if input.requires_grad:
        if out is not None:
            raise ValueError("out parameter not supported when requires_grad=True")
        return _SiLUAndMulFunction.apply(input)

    # Direct kernel call for inference (no backward needed)
    original_shape = input.shape
    hidden_size = original_shape[-1] // 2

    # Flatten input to 2D: (batch_size, 2 * hidden_size)
    input_flat = input.view(-1, original_shape[-1])
    batch_size = input_flat.shape[0]

    # Get final output shape
    output_shape = list(original_shape)
    output_shape[-1] = hidden_size
    # Prepare output tensor
    if out is not None:
        # Ensure out shape is correct
        if out.shape != tuple(output_shape):
            raise ValueError(f"Output tensor shape {out.shape} does not match expected shape {tuple(output_shape)}")
        output = out.view(-1, hidden_size)
    else:
        output = torch.empty(
            (batch_size, hidden_size),
            dtype=input.dtype,
            device=input.device,
        )

    _launch_forward(input_flat, output, hidden_size)
    return output.reshape(*output_shape)
