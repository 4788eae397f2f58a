"""Classify Triton kernels for TileIR: ``python scripts/classify_kernel.py --file k.py [--apply-optimizations]``."""
import sys

from cutile_perf.cli import main

raise SystemExit(main(["classify-triton", *sys.argv[1:]]))
