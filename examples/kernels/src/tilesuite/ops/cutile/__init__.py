"""cuTile implementations, one module per op.

Modules are imported on demand (``from tilesuite.ops.cutile.rms_norm import rms_norm``) so that a
kernel that fails to import does not take the others down, and so ``OPS`` can list what exists.
"""
from __future__ import annotations

import pkgutil
from pathlib import Path


def available_ops() -> list[str]:
    """Names of the op modules in this package (``rms_norm``, ``softmax``, ...), sorted."""
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_"))
