"""Representative kernel signatures, to compile kernels ahead of time without a GPU.

``KernelSignature.from_kernel_args`` needs a CUDA driver, so CI builds the signature by hand. The
constraints below are the ones the JIT infers for a freshly allocated, contiguous torch tensor whose
row length is a multiple of 16 bytes: 16-byte aligned base, unit stride in the last dimension, outer
strides divisible by 16 bytes, no aliasing, and (by default) every dimension a multiple of 16: the
JIT sets that bit per launch for shapes like the benchmark's (its kernel names in cuTile's disk
cache, demangled with ``cuda.tile.compilation.demangle_kernel_name``, carry shape divisibility 16
on the H200 run of benchmarks/kernel_sweep.py). Without it the sm_90 cubin has to bound-check every
element and moves 2 bytes per instruction (LDG.E.U16) where the JIT's cubin moves 16 (LDG.E.128),
so SASS read from an AOT build would misrepresent the kernel that runs. Each op module's
``aot_signatures()`` uses them.
"""
from __future__ import annotations

from collections.abc import Sequence


def contiguous(dtype, ndim: int, *, alias_group: str | None = None, shape_divisible_by: int = 16):
    """ArrayConstraint for a C-contiguous, 16-byte aligned array of ``dtype`` with ``ndim`` dims whose
    extents are multiples of ``shape_divisible_by`` (pass 1 for arbitrary shapes)."""
    from cuda.tile.compilation import ArrayConstraint
    import cuda.tile as ct

    elems_per_16_bytes = max(1, 16 // (dtype.bitwidth // 8))
    return ArrayConstraint(
        dtype,
        ndim,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=[alias_group] if alias_group else [],
        may_alias_internally=False,
        stride_constant=[None] * (ndim - 1) + [1],
        stride_divisible_by=[elems_per_16_bytes] * (ndim - 1) + [1],
        base_addr_divisible_by=16,
        shape_divisible_by=[shape_divisible_by] * ndim,
    )


def scalar(dtype):
    """A runtime scalar parameter (a Python float is passed as float32, an int as int32)."""
    from cuda.tile.compilation import ScalarConstraint

    return ScalarConstraint(dtype)


def signature(parameters: Sequence):
    """A KernelSignature in the calling convention the JIT uses for plain arrays and scalars."""
    from cuda.tile.compilation import CallingConvention, KernelSignature

    return KernelSignature(list(parameters), CallingConvention.cutile_python_v1())
