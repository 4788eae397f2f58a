"""Corpus kernel (element-wise): out = x + y, one autotune config."""
import torch
import triton
import triton.language as tl

VERIFY = {"entry": "add", "reference": "x + y",
          "shapes": [{"x": [1000], "y": [1000]}, {"x": [98432], "y": [98432]}],
          "dtypes": {"x": "float32", "y": "float32"}}


@triton.autotune(configs=[triton.Config({"BLOCK_SIZE": 1024}, num_warps=4)], key=["n_elements"])
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = out.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, n)
    return out
