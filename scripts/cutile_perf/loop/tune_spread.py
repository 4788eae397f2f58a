"""Tuning spread over a node's GPUs (``probe``/``prune``/``ab`` ``--gpus N|all --engine local|ray``, issue 41 item 2).

Each shape is one task: every config timed on that shape by one worker, which sees one GPU only
(``node``), so the configs a shape's ranking (or ``ab``'s comparison) compares were timed on the
same card, and the shapes run at once. The trials (``Trial.to_json``) or ``ab``'s rows come back as
data and are ranked or reported here as one process's would be. ``fakes`` is the tests' timer,
launcher and device (``evaluate.make_tuner``); across a process it travels by name, as
``"module:function"`` of a factory that returns them.
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cutile_perf import knobs, node
from cutile_perf.errors import IterationCrashed, UsageError
from cutile_perf.store import remove_tree
from cutile_perf.tune.analysis import ABRow
from cutile_perf.tune.config import Config, Trial
from cutile_perf.tune.evaluate import ab_confirm, ab_shape, make_tuner, run_shapes, stream_for
from cutile_perf.tune.tunable import Tunable, load_target, shape_label

TASK = "cutile_perf.loop.tune_spread:shape_task"
AB_TASK = "cutile_perf.loop.tune_spread:ab_task"

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


def ab_task(payload: dict) -> dict:
    """``ab`` on one shape, in this worker (``tune.evaluate.ab_shape``)."""
    tunable = load_target(payload["target"])
    fakes = dict(resolve_fakes(payload.get("fakes")) or {})
    confirm = ab_confirm(fakes, payload["rep_ms"])
    tuner = make_tuner(tunable, [Config(c) for c in payload["configs"]], fakes=fakes)
    return ab_shape(tuner, tunable, payload["shape"], confirm, stream=stream_for(fakes)).to_json()


def _run(spec: str, configs: Sequence[Config], shapes: Sequence[dict[str, int]], *, gpus: str, engine: str,
         fakes: Fakes, **extra) -> list[tuple[dict[str, int], dict]]:
    """(shape, its task's result) for every shape, one task each."""
    if fakes is not None and not isinstance(fakes, str):
        raise UsageError("fakes cross to a worker only by name (module:function)")
    tasks = {f"shape{i:03d}": {"configs": [c.to_json() for c in configs], "shape": dict(shape), "fakes": fakes,
                               **extra} for i, shape in enumerate(shapes)}
    with remove_tree.temporary_folder("cutile-perf-tune-pool-") as tmp:
        results = node.run_tasks(engine=engine, spec=spec, tasks=tasks, wanted=gpus, root=Path(tmp) / "pool",
                                 visible=knobs.visible_devices())
    return [(shape, results[task_id]) for task_id, shape in zip(tasks, shapes)]


def run_spread(target: str, configs: Sequence[Config], shapes: Sequence[dict[str, int]], *, gpus: str,
               engine: str, fakes: Fakes = None) -> dict[str, list[Trial]]:
    """``run_shapes``' result (shape label -> trials, in ``shapes``' order), each shape on one worker.
    A shape whose worker gave no result is an error naming it: a ranking without it would compare
    the configs on fewer shapes than asked."""
    out: dict[str, list[Trial]] = {}
    for shape, result in _run(TASK, configs, shapes, gpus=gpus, engine=engine, fakes=fakes, target=target):
        if result["status"] != "ok":
            raise UsageError(f"shape {shape_label(shape)}: its worker gave no result "
                             f"({result.get('error', result['status'])})")
        out.update({label: [Trial.from_json(t) for t in trials] for label, trials in result["result"].items()})
    return out


def time_shapes(target: str, tunable: Tunable, configs: Sequence[Config], shapes: Sequence[dict[str, int]], *,
                gpus: str, engine: str, fakes: Fakes = None) -> dict[str, list[Trial]]:
    """Every config on every shape: in this process, or spread (``spread``)."""
    if node.spreads(gpus, engine):
        return run_spread(target, configs, shapes, gpus=gpus, engine=engine, fakes=fakes)
    resolved = resolve_fakes(fakes)
    return run_shapes(make_tuner(tunable, configs, fakes=resolved), tunable, shapes, stream=stream_for(resolved))


def ab_spread(target: str, configs: Sequence[Config], shapes: Sequence[dict[str, int]], *, rep_ms: float,
              gpus: str, engine: str, fakes: Fakes = None) -> list[ABRow]:
    """``ab``'s rows, in ``shapes``' order, each shape's search and comparison on one worker. A
    shape whose worker failed (every config failed there, or the worker died) names it."""
    rows = []
    for shape, result in _run(AB_TASK, configs, shapes, gpus=gpus, engine=engine, fakes=fakes, target=target,
                              rep_ms=rep_ms):
        if result["status"] != "ok":
            raise IterationCrashed(f"shape {shape_label(shape)}: {result.get('error', result['status'])}")
        rows.append(ABRow.from_json(result["result"]))
    return rows
