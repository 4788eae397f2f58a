"""Verify a Triton kernel against torch: ``python scripts/verify_kernel.py --kernel k.py --reference ...``."""
import sys

from cutile_perf.cli import main

raise SystemExit(main(["verify-triton", *sys.argv[1:]]))
