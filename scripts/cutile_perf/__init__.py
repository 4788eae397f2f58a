"""cutile-perf: an experiment-loop harness and skill bundle for making cuTile kernels faster."""

__version__ = "0.1.0"
