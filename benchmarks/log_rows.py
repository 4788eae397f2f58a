"""One line per row of a cutile-perf session log: status, crash class, seconds, timings, reason.

    python benchmarks/log_rows.py sandbox/experiments.jsonl

What the GPU job scripts (tilegym_batch.sh, tilegym_loop.sh) print of a run, so that a job's output
shows every decision and where its time went even when the log file itself does not come back.
"""
from __future__ import annotations

import json
import sys


def row_line(row: dict) -> str:
    timings = row.get("timings", {})
    rest = {k: v for k, v in timings.items() if k != "total_s"}
    return (f"row {row['iteration']}: {row['status']} {row.get('crash_class') or ''} total {timings.get('total_s')} s, "
            f"timings {json.dumps(rest)}; {row.get('reason', '')[:160]}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/log_rows.py <experiments.jsonl>", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as log:
        for line in log:
            if line.strip():
                print(row_line(json.loads(line)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
