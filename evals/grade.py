"""Grade one task repository by measurement: ``python evals/grade.py <repo> [<task id>]``.

Same as ``python evals/run.py --grade-only <repo> [--task <id>]``; see ``evals/README.md``.
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "scripts")]
from cutile_perf_evals.cli import main  # noqa: E402

args = sys.argv[1:]
raise SystemExit(main(["--grade-only", *args[:1], *(["--task", args[1]] if len(args) > 1 else []), *args[2:]]))
