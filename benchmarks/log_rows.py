"""One line per row of a cutile-perf session log: status, crash class, seconds, timings, reason.

    python benchmarks/log_rows.py sandbox/experiments.jsonl [--runs sandbox/runs]

What the GPU job scripts (tilegym_batch.sh, tilegym_loop.sh) print of a run, so that a job's output
shows every decision and where its time went even when the log file itself does not come back.

With ``--runs`` (the children's logs), each stage also gets a line of what its log says: pytest's
own session time, the seconds of the stage outside it (start-up, imports before the session,
exit), and for a child started ahead of its turn its preloads and how long it waited at its gate.
A child let go before it was ready waits about 0 s there, and the rest of its start-up lands in
its stage: session 24 needed these figures by hand (benchmarks/results/2026-12-03-h200-s24/).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_SESSION = re.compile(r"\bin ([0-9.]+)s\b")  # pytest's last line: "6 passed, 4 deselected in 3.77s"
_PRELOADED = re.compile(r"preloaded (\d+) installed module\(s\).*?\(([0-9.]+) s\)")
_WAITED = re.compile(r"let go after ([0-9.]+) s at the gate \(ready ([0-9.]+) s after")
_AGAIN = re.compile(r"cutile-perf: (.*): running as a fresh child instead")


def row_line(row: dict) -> str:
    timings = row.get("timings", {})
    rest = {k: v for k, v in timings.items() if k != "total_s"}
    # The reason is cut short below; a re-check settled before its last pairs says so at its end.
    settled = (row.get("decision") or {}).get("settled_after")
    return (f"row {row['iteration']}: {row['status']} {row.get('crash_class') or ''} total {timings.get('total_s')} s, "
            f"timings {json.dumps(rest)}" + (f", settled after {settled} pair(s)" if settled else "")
            + f"; {row.get('reason', '')[:160]}")


def child_log_facts(text: str) -> dict:
    """What a child's log says of its time: ``session_s`` (pytest's own, from its summary line),
    ``ahead`` (started ahead of its turn), ``collected`` (collected ahead of its turn), ``preloads``/``preload_s``, ``waited_s``/``ready_s``
    (at its gate), ``started_again`` (why it ran as a fresh child after all); a key is missing when
    the log does not say."""
    lines = text.splitlines()
    facts: dict = {"ahead": bool(lines) and "(started ahead of its turn)" in lines[0],
                   "collected": bool(lines) and "(collected ahead of its turn)" in lines[0]}
    sessions = [m for line in lines if ("passed" in line or "failed" in line) and (m := _SESSION.search(line))]
    if sessions:
        facts["session_s"] = float(sessions[-1][1])
    if m := _PRELOADED.search(text):
        facts["preloads"], facts["preload_s"] = int(m[1]), float(m[2])
    if m := _WAITED.search(text):
        facts["waited_s"], facts["ready_s"] = float(m[1]), float(m[2])
    if m := _AGAIN.search(text):
        facts["started_again"] = m[1]  # it re-executed itself as a plain child, paying a start-up again
    return facts


def stage_line(stage: str, seconds: float, facts: dict) -> str:
    parts = [f"  {stage}: {seconds:.1f} s"]
    if "session_s" in facts and seconds >= facts["session_s"]:
        parts.append(f"pytest session {facts['session_s']:.2f} s, outside it {seconds - facts['session_s']:.1f} s")
    elif "session_s" in facts:  # a perf child held at its gate during the correctness run: timed from the gate
        parts.append(f"pytest session {facts['session_s']:.2f} s, begun while it was held at its gate")
    if facts.get("ahead"):
        parts.append("started ahead")
    if facts.get("collected"):
        parts.append("collected ahead (its session counts from its start, wait included)")
    if "preloads" in facts:
        parts.append(f"{facts['preloads']} preloads in {facts['preload_s']:.2f} s")
    if "waited_s" in facts:
        parts.append(f"waited {facts['waited_s']:.2f} s at the gate, ready {facts['ready_s']:.2f} s after it began")
    if "started_again" in facts:
        parts.append(f"started again as a fresh child ({facts['started_again']})")
    return ", ".join(parts)


def main(argv: list[str]) -> int:
    runs = None
    if len(argv) == 3 and argv[1] == "--runs":
        runs = Path(argv[2])
    elif len(argv) != 1:
        print("usage: python benchmarks/log_rows.py <experiments.jsonl> [--runs <runs folder>]", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as log:
        for line in log:
            if not line.strip():
                continue
            row = json.loads(line)
            print(row_line(row))
            for stage, seconds in (row.get("timings", {}).get("stages") or []) if runs else ():
                child_log = runs / f"{stage}.log"
                if child_log.is_file():
                    print(stage_line(stage, seconds, child_log_facts(child_log.read_text(errors="replace"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
