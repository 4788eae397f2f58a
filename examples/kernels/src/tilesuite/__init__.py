"""tilesuite: a small cuTile kernel suite laid out like NVIDIA TileGym.

Kernels live in ``tilesuite/ops/cutile/<op>.py``; each module exposes one public host function with a
fixed signature (for example ``rms_norm(x, weight, eps=1e-6)``) and an ``aot_signatures()`` hook that
lets CI compile the kernel without a GPU. See README.md for the conventions.
"""
from __future__ import annotations

__version__ = "0.1.0"
