"""``screen --gpus N|all --engine local|ray``: the rounds spread over a node's GPUs (issue 41 item 2).

The candidates that passed correctness are dealt into groups, one a worker (``node``): each worker
sees one GPU and runs the rounds of its own group against the base on that GPU, so every reading
is a ratio of two runs on one card, never across cards. A worker opens the session without its
lock (the ``screen`` that started it holds it and waits), and runs its children under its own tags
(``screen-w<i>-r<k>-...``), its own checkout paths (``slot_base``) and an empty compile cache of its
own, so no two workers share a file. What comes back is each candidate's paired samples, ranked by
the caller as one worker's would be.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from cutile_perf import knobs, node
from cutile_perf.child import measure
from cutile_perf.errors import UsageError
from cutile_perf.judge.verdict import paired_samples
from cutile_perf.loop import row
from cutile_perf.loop.stages import StageRunner
from cutile_perf.store import git_ops, remove_tree
from cutile_perf.store import session as session_mod
from cutile_perf.store.history import History

TASK = "cutile_perf.loop.screen_spread:group_task"
SLOT_STRIDE = 100  # checkout slots a worker may use before the next worker's begin


def deal(names: Sequence[str], workers: int) -> list[list[str]]:
    """The candidates dealt round-robin into at most ``workers`` groups, none empty (pure)."""
    groups = [list(names[i::workers]) for i in range(max(1, workers))]
    return [g for g in groups if g]


def group_task(payload: dict) -> dict:
    """One group's rounds on this worker's GPU: each candidate's paired samples per case."""
    # Imported here: loop.screen imports this module to spread its rounds.
    from cutile_perf.loop.screen import ScreenResult, run_rounds  # noqa: PLC0415

    began = time.monotonic()
    session = session_mod.load(Path(payload["repo"]))
    g = git_ops.open_repo(session.repo)
    history = History.open(session, g)
    ref, t = history.reference(), session.thresholds
    commits, index = dict(payload["commits"]), payload["index"]
    out = ScreenResult(base=ref.commit, candidates=[], tag_prefix=f"w{index}-")
    runner = StageRunner(session, g, measure.Deadline(session.timeout_s * (len(commits) + 1) + payload["seconds"]),
                         row.Clock(), fresh_compile_cache=True, preload=history.preload(),
                         slot_base=SLOT_STRIDE * (index + 1))
    with runner:
        pairs = run_rounds(runner, ref, t, commits, list(commits), payload["seconds"], began, time.monotonic, out,
                           payload.get("selection"))
    cases = sorted(payload.get("selection") or ref.medians)
    return {"samples": {name: paired_samples(p, cases) for name, p in pairs.items()},
            "dropped": out.dropped, "rounds": out.rounds, "stopped": out.stopped}


def spread_rounds(repo: Path, commits: dict[str, str], names: Sequence[str], seconds: float, *, workers: int,
                  gpus: str, engine: str, selection: dict[str, str] | None = None) -> tuple[dict, dict, dict, int, str]:
    """(samples by name, dropped, worker by name, fewest rounds of a group, why a group stopped) of
    ``names``' rounds, a group per worker (``node.worker_count``); ``selection``: the cases each run
    times (``screen.case_selection``), None: every case."""
    tasks = {f"group{i:02d}": {"repo": str(repo), "index": i, "seconds": seconds, "selection": selection,
                               "commits": {n: commits[n] for n in group}}
             for i, group in enumerate(deal(names, workers))}
    with remove_tree.temporary_folder("cutile-perf-screen-pool-") as tmp:
        results = node.run_tasks(engine=engine, spec=TASK, tasks=tasks, wanted=gpus, root=Path(tmp) / "pool",
                                 visible=knobs.visible_devices())
    samples, dropped, worker_of, rounds, stopped = {}, {}, {}, [], ""
    for task_id, task in tasks.items():
        result = results[task_id]
        if result["status"] != "ok":
            raise UsageError(f"screen: the worker of {', '.join(task['commits'])} gave no readings "
                             f"({result.get('error', result['status'])})")
        found = result["result"]
        samples.update({n: {c: (list(b), list(v)) for c, (b, v) in per.items()} for n, per in found["samples"].items()})
        dropped.update({n: tuple(v) for n, v in found["dropped"].items()})
        worker_of.update({n: result.get("worker", "") for n in task["commits"]})
        rounds.append(found["rounds"])
        stopped = stopped or found["stopped"]
    return samples, dropped, worker_of, min(rounds, default=0), stopped
