"""Run, prepare or grade the cutile-perf evals: ``python evals/run.py --help``."""
import sys
from pathlib import Path

# This checkout's harness first: the evals grade and install the cutile-perf they ship with.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "scripts")]
from cutile_perf_evals.cli import main  # noqa: E402

raise SystemExit(main())
