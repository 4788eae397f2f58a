"""Corpus kernel (dot-related, risky for TileIR): split-K matmul whose partial tiles meet through atomics."""
import torch
import triton
import triton.language as tl

# fp16 operands, fp32 accumulation and fp32 atomics, as split-K is used in practice. Not fp32
# operands: tl.dot on fp32 defaults to input_precision="tf32", which on H200 drops 13 mantissa bits
# and was 0.12 off torch's fp32 `a @ b` here (the first GPU run failed on exactly that). fp16
# products are exact in fp32, so against a float64 reference only the summation order differs
# (2e-5 at K=1024 in the CPU interpreter); the tolerance leaves room for that but still fails an output that was not
# zeroed before accumulating (off by |c|, tens) or a lost K slice.
VERIFY = {"entry": "splitk_matmul", "reference": "a.double() @ b.double()",
          "shapes": [{"a": [128, 1024], "b": [1024, 128]}, {"a": [100, 520], "b": [520, 72]}],
          "dtypes": {"a": "float16", "b": "float16"}, "atol": 0.01, "rtol": 0.001}


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "SPLIT_K": 4}, num_warps=4),
        triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 2}, num_warps=4),
    ],
    key=["M", "N", "K"],
    reset_to_zero=["c_ptr"],  # partial sums accumulate into c: every timed run must start from zero
)
@triton.jit
def splitk_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_mn = tl.program_id(0)
    pid_k = tl.program_id(1)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid_mn // grid_n
    pid_n = pid_mn % grid_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K blocks pid_k, pid_k + SPLIT_K, pid_k + 2 * SPLIT_K, ... belong to this program.
    for k0 in range(0, K, BLOCK_K * SPLIT_K):
        rk = k0 + pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.atomic_add(c_ptrs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def splitk_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    M, K = a.shape
    _, N = b.shape
    c = torch.zeros((M, N), device=a.device, dtype=torch.float32)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])

    splitk_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    return c
