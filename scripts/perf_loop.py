"""Run the experiment loop without installing: ``python scripts/perf_loop.py <command> ...``."""
import sys

from cutile_perf.cli import main

raise SystemExit(main(sys.argv[1:]))
