"""``cutile-perf survey``: which cuTile ops of a TileGym-shaped repo the loop can drive."""
from __future__ import annotations

from pathlib import Path

from cutile_perf.store import git_ops
from cutile_perf.kernel import survey as survey_mod
from cutile_perf.loop import survey_spread
from cutile_perf.output import Outcome, say
from cutile_perf.errors import UsageError
from cutile_perf.store.session import parse_timeout


def survey(*, repo: Path, run: bool, timeout_s: float, sample: int, jobs: int, under: str | None, markdown: bool,
           logs: Path | None, budget_s: float | None = None, ops: tuple[str, ...] = (), gpus: str = "1",
           engine: str = "local") -> Outcome:
    timeout_s = parse_timeout(timeout_s)
    if budget_s is not None:
        budget_s = parse_timeout(budget_s, "--budget")
    if sample < 0 or jobs < 1:
        raise UsageError("--sample must be >= 0 and --jobs >= 1")
    root = git_ops.root(git_ops.open_repo(repo)).resolve()
    done = [0]

    def progress(row: survey_mod.OpRow) -> None:
        done[0] += 1
        say(f"[{done[0]}] {row.kernel}: " + " ".join(survey_mod.row_cells(row, run)[3:]))

    # One GPU on the local engine: this process as before (no worker, no extra process hop).
    spread = None if (gpus, engine) == ("1", "local") else survey_spread.spreader(
        root, engine=engine, gpus=gpus, run=run, timeout_s=timeout_s, sample=sample, log_dir=logs, budget_s=budget_s)
    rows = survey_mod.survey(root, run=run, timeout_s=timeout_s, sample=sample, jobs=jobs, under=under,
                             log_dir=logs, budget_s=budget_s, progress=progress, ops=ops, spread=spread)
    counts = survey_mod.summary(rows)
    table = survey_mod.render_table(rows, with_runs=run, markdown=markdown)
    no_cuda = survey_mod.no_cuda_reason(rows)
    if no_cuda:  # one line for what failed and what still works, not an error in every row
        tail = f"{counts['ops']} ops, {counts['paired']} with a test file; " + survey_mod.no_cuda_line(no_cuda)
    else:
        tail = (f"{counts['ops']} ops, {counts['paired']} with a test file, {counts['with_perf_test']} with a "
                f"perf test, {counts['drivable']} drivable" + (" (both runs passed)" if run else
                                                               " (selections non-empty; --run to run them)"))
    text = "\n".join([table, "", tail])
    return Outcome(text, {"repo": str(root), "run": run, "sample": sample, "timeout_s": timeout_s,
                          "summary": counts, "no_cuda": no_cuda, "ops": [r.to_dict() for r in rows],
                          "markdown": survey_mod.render_table(rows, with_runs=run, markdown=True)})
