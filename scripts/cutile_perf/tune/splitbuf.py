"""Split-buffer tuning for in-place kernels: the search writes to scratch copies, never to the caller's tensors."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def scratch_like(value: Any) -> Any:
    """A copy with the same shape, strides and dtype (torch), so it specializes like the original."""
    if hasattr(value, "stride") and hasattr(value, "new_empty_strided"):
        return value.new_empty_strided(value.size(), value.stride()).copy_(value)
    if hasattr(value, "copy"):  # numpy arrays, used by CPU tests
        return value.copy()
    raise TypeError(f"cannot make a scratch copy of {type(value).__name__}")


def split_buffer(args_fn: Callable[[Any], tuple], inplace: Sequence[int]) -> Callable[[Any], tuple]:
    """``args_fn`` with the arguments at positions ``inplace`` replaced by scratch copies.

    Each distinct tensor is copied once per search (not per launch) and reused by every config.
    """
    scratch: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, copy); the original keeps id() unique

    def search_args(cfg):
        args = list(args_fn(cfg))
        for i in inplace:
            if i >= len(args):
                raise IndexError(f"inplace position {i} but the kernel has {len(args)} arguments")
            original = args[i]
            entry = scratch.get(id(original))
            if entry is None:
                entry = scratch[id(original)] = (original, scratch_like(original))
            args[i] = entry[1]
        return tuple(args)

    return search_args
