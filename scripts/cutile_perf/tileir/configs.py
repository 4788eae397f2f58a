"""TileIR config variants per kernel type: the one table the classifier's advice and the
generated code both read.

Values follow public TileIR-side templates (sources in references/triton-tileir.md): the backend's
tuning tips (``occupancy`` and ``num_ctas`` matter, ``num_stages`` is a hint, larger tiles for dot
kernels), its persistent-matmul tutorial (128/256 tiles, ``num_ctas`` 1-2) and TileGym's gated
norm/dropout configs (``occupancy`` 1-16 with ``num_warps`` 4/8). They are starting points for the
autotuner, not measured winners.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variants:
    strategy: str
    occupancy: tuple[int, ...]
    num_stages: tuple[int, ...] | None = None  # None: keep each original config's value
    num_warps: tuple[int, ...] | None = None
    num_ctas: tuple[int, ...] | None = None
    # (BLOCK_M, BLOCK_N) tiles tried on top of the originals, for kernels whose configs name both.
    larger_tiles: tuple[tuple[int, int], ...] = ()
    # Bound on generated configs per kernel: autotuning time grows linearly with it.
    cap: int = 24


VARIANTS: dict[str, Variants] = {
    "dot-related": Variants(
        strategy="TMA descriptors + 2-CTA (num_ctas=2) + occupancy + larger tiles",
        occupancy=(1, 2),
        num_ctas=(1, 2),  # num_stages stays each original's: tiles x occupancy x num_ctas already fill the cap
        larger_tiles=((128, 256), (256, 128), (256, 256)),
    ),
    "norm-like": Variants(strategy="high occupancy", occupancy=(1, 2, 4), num_warps=(4, 8)),
    "reduction": Variants(strategy="high occupancy", occupancy=(1, 2, 4), num_warps=(4, 8)),
    "element-wise": Variants(strategy="occupancy + num_stages", occupancy=(1, 2, 4, 16), num_stages=(2, 3, 4)),
}


def describe(kind: str) -> str:
    """Human summary of what gets added for a kernel type, e.g. for changes_applied."""
    v = VARIANTS[kind]
    parts = [f"occupancy {'/'.join(map(str, v.occupancy))}"]
    if v.num_warps:
        parts.append(f"num_warps {'/'.join(map(str, v.num_warps))}")
    if v.num_stages:
        parts.append(f"num_stages {'/'.join(map(str, v.num_stages))}")
    if v.num_ctas:
        parts.append(f"num_ctas {'/'.join(map(str, v.num_ctas))}")
    if v.larger_tiles:
        parts.append("tiles " + ", ".join(f"{m}x{n}" for m, n in v.larger_tiles))
    return " x ".join(parts) + f" (at most {v.cap})"
