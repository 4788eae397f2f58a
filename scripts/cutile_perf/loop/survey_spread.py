"""``survey --gpus N|all --engine local|ray``: the ops of a survey spread over a worker per GPU.

Each op is one task (``op_task``): its collections and, with ``--run``, its runs, in a worker that
sees one GPU only (``node``), so two ops never time on one GPU at once and a node's GPUs all work.
The op's row comes back as data (``OpRow.to_data``) and is rebuilt here, in the survey's order.
``--budget`` is one wall-clock end shared by every worker (``budget_end``: seconds since the epoch,
since a worker's monotonic clock is its own).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from cutile_perf import knobs, node
from cutile_perf.kernel import survey as survey_mod
from cutile_perf.store import remove_tree

TASK = "cutile_perf.loop.survey_spread:op_task"


def op_task(payload: dict) -> dict:
    """One op surveyed in this worker: the task function every engine runs."""
    end = payload["budget_end"]
    budget = survey_mod.Budget(None if end is None else max(0.0, end - time.time()))
    row = survey_mod.survey_op(Path(payload["root"]), Path(payload["kernel"]), run=payload["run"],
                               timeout_s=payload["timeout_s"], sample=payload["sample"],
                               log_dir=Path(payload["log_dir"]), budget=budget)
    return row.to_data()


def spreader(root: Path, *, engine: str, gpus: str, run: bool, timeout_s: float, sample: int,
             log_dir: Path | None, budget_s: float | None) -> Callable[[list[Path]], list[survey_mod.OpRow]]:
    """What ``survey_mod.survey`` calls with the chosen op files (its ``spread``)."""
    budget_end = None if budget_s is None else time.time() + budget_s

    def spread(kernels: list[Path]) -> list[survey_mod.OpRow]:
        with remove_tree.temporary_folder("cutile-perf-survey-pool-") as tmp:
            logs = Path(log_dir) if log_dir else Path(tmp) / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            tasks = {f"op{i:04d}": {"root": str(root), "kernel": str(k), "run": run, "timeout_s": timeout_s,
                                    "sample": sample, "log_dir": str(logs), "budget_end": budget_end}
                     for i, k in enumerate(kernels)}
            results = node.run_tasks(engine=engine, spec=TASK, tasks=tasks, wanted=gpus, root=Path(tmp) / "pool",
                                     visible=knobs.visible_devices())
            return [_row(root, kernel, results[task_id]) for task_id, kernel in zip(tasks, kernels)]

    return spread


def _row(root: Path, kernel: Path, result: dict) -> survey_mod.OpRow:
    """The op's row, or one whose problem says why its worker gave none (an error, or lost)."""
    if result["status"] == "ok":
        return survey_mod.OpRow.from_data(result["result"])
    why = result.get("error", result["status"])
    return survey_mod.OpRow(kernel=kernel.relative_to(root).as_posix(), problem=f"its worker failed: {why}")
