"""Tuning spread over a node's GPUs (``probe --gpus N|all --engine local|ray``, issue 41 item 2).

Each shape is one task: every config timed on that shape by one worker, which sees one GPU only
(``node``), so the configs a shape's ranking compares were timed on the same card, and the shapes
run at once. The trials come back as data (``Trial.to_json``) and are ranked here as one process's
would be. ``fakes`` is the tests' timer, launcher and device (``evaluate.make_tuner``); across a
process it travels by name, as ``"module:function"`` of a factory that returns them.
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cutile_perf import knobs, node
from cutile_perf.errors import UsageError
from cutile_perf.store import remove_tree
from cutile_perf.tune.config import Config, Trial
from cutile_perf.tune.evaluate import make_tuner, run_shapes, stream_for
from cutile_perf.tune.tunable import load_target, shape_label

TASK = "cutile_perf.loop.tune_spread:shape_task"

Fakes = dict[str, Any] | str | None


def resolve_fakes(fakes: Fakes) -> dict[str, Any] | None:
    """The fakes themselves: a dict as given, or what the ``"module:function"`` factory returns."""
    if not isinstance(fakes, str):
        return fakes
    module, _, function = fakes.partition(":")
    return getattr(importlib.import_module(module), function)()


def shape_task(payload: dict) -> dict:
    """Every config on one shape, in this worker: the task function every engine runs."""
    tunable = load_target(payload["target"])
    fakes = resolve_fakes(payload.get("fakes"))
    tuner = make_tuner(tunable, [Config(c) for c in payload["configs"]], fakes=fakes)
    results = run_shapes(tuner, tunable, [payload["shape"]], stream=stream_for(fakes))
    return {label: [trial.to_json() for trial in trials] for label, trials in results.items()}


def run_spread(target: str, configs: Sequence[Config], shapes: Sequence[dict[str, int]], *, gpus: str,
               engine: str, fakes: Fakes = None, listing: str | None = None) -> dict[str, list[Trial]]:
    """``run_shapes``' result (shape label -> trials, in ``shapes``' order), each shape on one worker.
    A shape whose worker gave no result is an error naming it: a ranking without it would compare
    the configs on fewer shapes than asked."""
    if fakes is not None and not isinstance(fakes, str):
        raise UsageError("fakes cross to a worker only by name (module:function)")
    tasks = {f"shape{i:03d}": {"target": target, "configs": [c.to_json() for c in configs], "shape": dict(shape),
                               "fakes": fakes} for i, shape in enumerate(shapes)}
    with remove_tree.temporary_folder("cutile-perf-tune-pool-") as tmp:
        results = node.run_tasks(engine=engine, spec=TASK, tasks=tasks, wanted=gpus, root=Path(tmp) / "pool",
                                 visible=knobs.visible_devices(), listing=listing)
    out: dict[str, list[Trial]] = {}
    for task_id, shape in zip(tasks, shapes):
        result = results[task_id]
        if result["status"] != "ok":
            raise UsageError(f"shape {shape_label(shape)}: its worker gave no result "
                             f"({result.get('error', result['status'])})")
        out.update({label: [Trial.from_json(t) for t in trials] for label, trials in result["result"].items()})
    return out
