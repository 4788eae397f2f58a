"""cutile-perf: an experiment-loop harness and skill bundle for making cuTile kernels faster."""

from pathlib import Path

__version__ = "0.1.0"


def checkout_root() -> Path:
    """The checkout this package runs from (``<root>/scripts/cutile_perf/``): where ``SKILL.md``,
    ``templates/`` and ``examples/`` live. In an installed wheel it holds none of them; callers check."""
    return Path(__file__).resolve().parents[2]
