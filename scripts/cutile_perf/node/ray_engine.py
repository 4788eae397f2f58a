"""The Ray engine (``--engine ray``, the optional ``ray`` extra): a Ray actor per GPU runs the same worker.

Each actor asks Ray for one GPU (``num_gpus=1``), so Ray sets its ``CUDA_VISIBLE_DEVICES`` to that
GPU alone, on whichever host of the cluster has it. The driver keeps the task folder
(``node.tasks``): it claims a task for an actor, and records the result once when the actor returns
it. An actor that dies mid-task (killed, its host lost) raises ``RayActorError`` here: its claim is
released (re-queued, or lost past ``max_attempts``) and a new actor takes its place.

The cluster is the one ``ray.init()`` finds (``RAY_ADDRESS``, or one ``ray start`` began on this
host), else a local one Ray starts; the caller may have called ``ray.init`` itself (tests do).
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path

from cutile_perf.errors import EnvMissing, UsageError
from cutile_perf.node.tasks import TaskDir
from cutile_perf.node.worker import run_task

NAMESPACE = "cutile-perf"
MODEL_PREFIX = "accelerator_type:"  # Ray's resource naming each host's GPU model


def import_ray():
    try:
        import ray  # noqa: PLC0415 - the optional extra, imported only for --engine ray
    except ImportError as exc:
        raise EnvMissing("--engine ray needs Ray, which is not installed",
                         "pip install 'cutile-perf[ray]' (or use --engine local)") from exc
    return ray


def cluster_gpus(resources: Mapping[str, float], wanted: str) -> int:
    """How many actors: ``--gpus N|all`` against the cluster's GPU resources; mixed models refused."""
    models = sorted(k[len(MODEL_PREFIX):] for k in resources if k.startswith(MODEL_PREFIX))
    if len(models) > 1:
        raise UsageError(f"the Ray cluster's GPUs are of {len(models)} models ({', '.join(models)}); "
                         "a screen ranks on one model only", "start the cluster on hosts of one GPU model")
    offered = int(resources.get("GPU", 0))
    if offered < 1:
        raise UsageError("the Ray cluster offers no GPU", "start Ray on GPU hosts (ray start --num-gpus ...)")
    if wanted == "all":
        return offered
    if not wanted.isdigit() or not 1 <= int(wanted) <= offered:
        raise UsageError(f"--gpus {wanted}: the Ray cluster offers {offered} GPU(s)", "use --gpus all or a count")
    return int(wanted)


def _actor_class(ray):
    @ray.remote(num_gpus=1, max_restarts=0)
    class Worker:  # one GPU's worker: the same run_task as a local worker process
        def run(self, spec: str, payload: dict) -> dict:
            return run_task(spec, payload)

    return Worker


def run_ray(tasks: Mapping[str, dict], spec: str, gpus: int, root: Path, *, max_attempts: int = 2) -> dict[str, dict]:
    """Run every task (id -> payload) through ``spec`` on ``gpus`` Ray actors; returns id -> result,
    one for every task (status "ok", "error" or "lost")."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(namespace=NAMESPACE)
    folder = TaskDir(root)
    for task_id, payload in tasks.items():
        folder.submit(task_id, payload)
    actors = _Actors(_actor_class(ray), uuid.uuid4().hex[:8])
    idle = [actors.new() for _ in range(gpus)]  # (actor, its name)
    running: dict = {}  # the pending reference -> ((actor, name), the claimed task)
    try:
        while folder.outstanding(tasks):
            _dispatch(folder, idle, running, spec)
            if not running:
                break
            ready, _ = ray.wait(list(running), num_returns=1)
            worker, task = running.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayActorError:
                folder.release(worker[1], max_attempts)  # its task back to the queue, or recorded lost
                idle.append(actors.new())
                continue
            folder.finish(worker[1], task["id"], {**result, "attempt": task["attempt"]})
            idle.append(worker)
    finally:
        for actor, _ in idle + [w for w, _ in running.values()]:
            ray.kill(actor)
    found = folder.results()
    return {task_id: found[task_id] for task_id in tasks}


class _Actors:
    """Names each new actor after the run and a serial number (named: a test, or a user, can find and kill one)."""

    def __init__(self, worker_class, run: str):
        self.worker_class, self.run, self.count = worker_class, run, 0

    def new(self) -> tuple:
        name = f"cutile-perf-{self.run}-w{self.count}"
        self.count += 1
        return self.worker_class.options(name=name, namespace=NAMESPACE).remote(), name


def _dispatch(folder: TaskDir, idle: list, running: dict, spec: str) -> None:
    """Give each idle actor a task, claimed (by rename) under the actor's own name."""
    while idle:
        actor, name = idle[-1]
        task = folder.claim(name)
        if task is None:
            return
        idle.pop()
        running[actor.run.remote(spec, task["payload"])] = ((actor, name), task)
