"""Host-side helpers shared by the op modules (never traced by cuTile)."""
from __future__ import annotations

import functools


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (tile extents must be powers of two)."""
    if n < 1:
        raise ValueError(f"next_power_of_2 needs n >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def current_stream():
    """The torch stream cuTile should launch on, so our kernels order with torch's work."""
    import torch

    return torch.cuda.current_stream()


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """Number of SMs, cached: the query is a driver call and persistent grids ask for it each launch."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def as_rows(x):
    """View ``x`` as a contiguous 2-D (rows, last_dim) tensor, copying only if it is not contiguous."""
    if x.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension")
    x = x.contiguous()
    return x.reshape(-1, x.shape[-1])
