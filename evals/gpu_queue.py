"""The GPU job queue for agents on a machine without a GPU: ``python evals/gpu_queue.py --help``."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "scripts")]
from cutile_perf_evals.gpuqueue import main  # noqa: E402

raise SystemExit(main())
