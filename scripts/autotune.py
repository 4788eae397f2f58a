"""Shim: ``python scripts/autotune.py probe|ab|prune ...`` runs ``cutile-perf probe|ab|prune ...``."""
import sys

from cutile_perf.cli import main

raise SystemExit(main(sys.argv[1:] or ["probe", "--help"]))
