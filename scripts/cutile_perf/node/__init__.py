"""Work spread over a node's GPUs, or a Ray cluster's: GPU discovery, a task folder claimed by rename,
one worker per GPU (the local engine, the default, needs nothing), and the Ray engine (optional extra).

Only independent work is spread (each screened candidate's rounds, other ops); a comparison stays
on the one GPU its worker sees. ``run_tasks`` is the one entry: an engine name, the task function
(``"module:function"``), the tasks; it returns one result per task.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from cutile_perf.errors import UsageError
from cutile_perf.node import gpus as gpus_mod
from cutile_perf.node import ray_engine
from cutile_perf.node.local import run_local

ENGINES = ("local", "ray")


def spreads(gpus: str, engine: str) -> bool:
    """Whether work goes to a worker pool: ``--gpus 1`` on the local engine runs in this process."""
    return not (gpus == "1" and engine == "local")


def _local_gpus(wanted: str, visible: str | None, listing: str | None) -> list:
    listing = gpus_mod.smi_listing() if listing is None else listing
    return gpus_mod.pick(gpus_mod.discover(visible, listing), wanted)


def _ray_actors(wanted: str) -> int:
    ray = ray_engine.import_ray()  # only here: the extra is optional
    if not ray.is_initialized():
        ray.init(namespace=ray_engine.NAMESPACE)
    return ray_engine.cluster_gpus(ray.cluster_resources(), wanted)


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise UsageError(f"--engine is one of {', '.join(ENGINES)}, not {engine!r}")


def worker_count(*, engine: str, wanted: str, visible: str | None = None, listing: str | None = None) -> int:
    """How many workers ``run_tasks`` would start for ``--gpus wanted``: work can be dealt into that many."""
    _check_engine(engine)
    return len(_local_gpus(wanted, visible, listing)) if engine == "local" else _ray_actors(wanted)


def run_tasks(*, engine: str, spec: str, tasks: Mapping[str, dict], wanted: str, root: Path,
              visible: str | None = None, listing: str | None = None) -> dict[str, dict]:
    """Every task run once on one worker of ``engine`` (``--gpus`` is ``wanted``); ``visible`` and
    ``listing`` (CUDA_VISIBLE_DEVICES, nvidia-smi's listing) are the local engine's view of the node."""
    _check_engine(engine)
    if engine == "local":
        return run_local(tasks, spec, _local_gpus(wanted, visible, listing), root)
    return ray_engine.run_ray(tasks, spec, _ray_actors(wanted), root)
