"""``cutile-perf report``: sandbox/report.md and the running-best plot, rendered from the log."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from cutile_perf.store import atomic, git_ops
from cutile_perf.store.history import History
from cutile_perf.loop import render
from cutile_perf.store import session as session_mod
from cutile_perf.output import Outcome
from cutile_perf.errors import Refused


def report(*, repo: Path, output: Path | None) -> Outcome:
    session = session_mod.load(repo)
    # Opened as try opens it: a log try would refuse is refused here, never rendered as a result.
    entries = History.open(session, git_ops.open_repo(session.repo)).rows
    if not entries:
        raise Refused("the log is empty: nothing to report", "run `cutile-perf baseline` first")
    target = output or session.sandbox / "report.md"
    plot = render.plot_running_best(entries, target.parent / "running_best.png")
    described = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(session).items()}
    # The plot sits next to the report and is linked by its bare name, so report.md still shows it
    # wherever the two files are copied together (an absolute path breaks on any other machine).
    atomic.write_text(target, render.render_report(entries, described, plot.name,
                                                   changed_thresholds=session.thresholds.changed(),
                                                   edited_commands=session.edited_commands()))
    return Outcome(f"report: {target} (plot: {plot})", {"report": str(target), "plot": str(plot),
                                                          "iterations": len(entries)})
