"""Is the Triton TileIR backend usable here? ``python scripts/tileir_check.py`` (JSON; exit 1 when not ready)."""
import sys

from cutile_perf.cli import main

raise SystemExit(main(["tileir-check", *sys.argv[1:]]))
