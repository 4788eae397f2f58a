"""What a capture keeps of a large tensor, so that checking every perf case does not cost its bytes.

Checked timing (``checked``) needs, per timed call, the inputs the base kernel replays and the
candidate's results; saved whole, they cost a TileGym perf run gigabytes and minutes (the figures:
``docs/design.md``, "Checked timed calls"). A tensor up to ``INLINE_BYTES`` is still saved whole; a
larger one is kept as:

* an **input**: its ``fingerprint`` (two position-weighted sums of its bytes). The reference child
  runs the same test from the base checkout; a seeded test (TileGym's ``setUp`` seeds torch) builds
  the same tensor there, which the fingerprint confirms, and the base kernel runs on its own copy.
  A test whose inputs differ there says so: that call is unchecked, never judged on other inputs.
* a **result**: its ``summary``: the sums along its last dimension (one per row) and over its other
  dimensions (one per column), in float64 (exact int64 for integers), and ``SAMPLE`` elements at
  positions drawn from ``os.urandom`` after the call. ``compare_results`` checks the sampled
  elements by the dtype's tolerance and every row and column sum against the bound that elementwise
  tolerance implies (the sum of ``atol + rtol * |base|`` over the row): results that match
  elementwise always pass, and a row or column left unwritten, stale or NaN fails. What it can miss:
  a few wrong elements that the sample misses and whose errors stay within the sums' bounds.
"""
from __future__ import annotations

import math
import os

INLINE_BYTES = 8 << 20  # a tensor up to this size is saved whole
SAMPLE = 1 << 16  # elements of a summarized result compared one by one
CHUNK = 1 << 24  # elements widened at once (float64 or int64: 128 MB of device memory)
_MASK = (1 << 64) - 1


def nbytes(t) -> int:
    return t.numel() * t.element_size()


def is_kept_whole(value) -> bool:
    return not isinstance(value, dict)


def kept_nbytes(torch, value) -> int:
    """The bytes of the tensor a kept value stands for, saved whole, fingerprinted or summarized."""
    if is_kept_whole(value):
        return nbytes(value)
    shape, dtype = shape_and_dtype(value)
    return math.prod(shape) * getattr(torch, dtype.removeprefix("torch.")).itemsize


def keep_input(torch, t):
    """A host copy of ``t``, or, past ``INLINE_BYTES``, its fingerprint with its shape and dtype."""
    if nbytes(t) <= INLINE_BYTES:
        return t.detach().to("cpu", copy=True)
    return {"fingerprint": fingerprint(torch, t), "shape": list(t.shape), "dtype": str(t.dtype)}


def keep_result(torch, t):
    """A host copy of ``t``, or, past ``INLINE_BYTES``, its summary (module docstring)."""
    if nbytes(t) <= INLINE_BYTES or t.dim() == 0:
        return t.detach().to("cpu", copy=True)
    seed = int.from_bytes(os.urandom(8), "little") >> 1
    positions = torch.randint(t.numel(), (min(t.numel(), SAMPLE),), generator=torch.Generator().manual_seed(seed))
    flat = t.detach().reshape(-1)
    rows, cols = line_sums(torch, t, absolute=False)
    return {"summary": True, "shape": list(t.shape), "dtype": str(t.dtype), "rows": rows.cpu(), "cols": cols.cpu(),
            "positions": positions, "values": flat[positions.to(flat.device)].cpu()}


def shape_and_dtype(value) -> tuple[tuple, str]:
    """What a kept tensor (whole, fingerprinted or summarized) says of its shape and dtype."""
    if is_kept_whole(value):
        return tuple(value.shape), str(value.dtype)
    return tuple(value["shape"]), value["dtype"]


def fingerprint(torch, t) -> list[int]:
    """Two position-weighted sums of ``t``'s bytes, mod 2**64 (as int32 words where they align): equal
    tensors give the same on any device; a changed or moved byte changes them. Not a cryptographic
    digest, nor does it need to be: inputs that differ only make the check refuse or fail."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    words = raw
    if raw.numel() % 4 == 0:
        try:
            words = raw.view(torch.int32)
        except RuntimeError:  # a storage offset that int32 words cannot align with: bytes will do
            words = raw
    first = second = 0
    for start in range(0, words.numel(), CHUNK):
        x = words[start:start + CHUNK].to(torch.int64)
        at = torch.arange(start, start + x.numel(), device=x.device, dtype=torch.int64)
        first = (first + int((x * (at * 0x9E3779B1 + 1)).sum())) & _MASK
        second = (second + int(((x + 0x7F4A7C15) * (at ^ 0x5851F42D)).sum())) & _MASK
    return [words.numel(), first, second]


def _wide(torch, t, absolute: bool):
    """``t`` (or ``|t|``) in the widest type of its kind: complex128, float64 or int64."""
    kind = torch.complex128 if t.is_complex() else torch.float64 if t.is_floating_point() else torch.int64
    wide = t.to(kind)
    return wide.abs() if absolute else wide


def line_sums(torch, t, absolute: bool):
    """(sum along the last dimension, one per row; sum over the other dimensions, one per column) of
    ``t`` widened (or of ``|t|``), ``CHUNK`` elements at a time (a row longer than that in parts)."""
    last = t.shape[-1] if t.dim() else 1
    grid = t.detach().reshape(-1, last)
    col_step = max(1, min(last, CHUNK))
    row_step = max(1, CHUNK // col_step)
    cols = torch.zeros(last, dtype=_wide(torch, grid[:0, :0], absolute).dtype, device=grid.device)
    rows = []
    for r in range(0, grid.shape[0], row_step):
        acc = None
        for c in range(0, last, col_step):
            part = _wide(torch, grid[r:r + row_step, c:c + col_step], absolute)
            acc = part.sum(dim=1) if acc is None else acc + part.sum(dim=1)
            cols[c:c + col_step] += part.sum(dim=0)
        rows.append(acc)
    return (torch.cat(rows) if rows else cols[:0]), cols
