"""Corpus kernel (norm-like): layer norm forward, plain @triton.jit (no autotune)."""
import torch
import triton
import triton.language as tl

VERIFY = {"entry": "layer_norm",
          "reference": "torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)",
          "shapes": [{"x": [16, 256], "w": [256], "b": [256]}],
          "dtypes": {"x": "float32", "w": "float32", "b": "float32"}}


@triton.jit
def _layer_norm_fwd(X, Y, W, B, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / N
    rstd = 1 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=mask)
    b = tl.load(B + cols, mask=mask)
    tl.store(Y + row * stride + cols, xc * rstd * w + b, mask=mask)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    y = torch.empty_like(x)
    n_rows, n = x.shape
    _layer_norm_fwd[(n_rows,)](x, y, w, b, x.stride(0), n, eps, BLOCK_SIZE=triton.next_power_of_2(n))
    return y
