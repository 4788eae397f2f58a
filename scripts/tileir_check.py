"""Is the Triton TileIR backend usable here? ``python scripts/tileir_check.py [--strict]`` (JSON)."""
import sys

from cutile_perf.cli import main

raise SystemExit(main(["tileir-check", *sys.argv[1:]]))
