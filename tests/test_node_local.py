"""node.local: one worker process per (simulated) GPU; each task on one worker, recorded once, a
worker killed mid-task re-queued or reported. No GPU needed: the "GPUs" are CUDA_VISIBLE_DEVICES values."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cutile_perf.errors import EXIT_REFUSED, EnvMissing, UsageError
from cutile_perf.node import run_tasks
from cutile_perf.node.gpus import Gpu
from cutile_perf.node.local import run_local

TESTS = Path(__file__).resolve().parent
TWO = [Gpu("0", "sim"), Gpu("1", "sim")]


@pytest.fixture(autouse=True)
def task_functions_importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the workers import tests/node_tasks.py by name


def _runs(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split() if path.exists() else []


def test_tasks_spread_over_two_workers_each_seeing_its_own_gpu(tmp_path):
    runs = tmp_path / "runs"
    tasks = {f"t{i}": {"value": i, "sleep": 0.3, "runs": str(runs)} for i in range(6)}
    out = run_local(tasks, "node_tasks:echo", TWO, tmp_path / "pool")
    assert {k: v["result"]["value"] for k, v in out.items()} == {f"t{i}": i for i in range(6)}
    assert {v["result"]["device"] for v in out.values()} == {"0", "1"}  # both GPUs worked
    by_worker = {v["worker"]: v["result"]["device"] for v in out.values()}
    assert len(by_worker) == 2 and sorted(by_worker.values()) == ["0", "1"]  # a worker sees one GPU only
    assert sorted(_runs(runs)) == [str(i) for i in range(6)]  # each ran once


def test_a_failing_task_is_a_result_and_its_worker_goes_on(tmp_path):
    out = run_local({"a": {"value": 1}, "b": {"value": 2}}, "node_tasks:boom", TWO[:1], tmp_path / "pool")
    assert [v["status"] for v in out.values()] == ["error", "error"]
    assert "task 1 failed" in out["a"]["error"]


def test_a_worker_killed_mid_task_has_its_task_rerun_and_recorded_once(tmp_path):
    runs = tmp_path / "runs"
    tasks = {"dies": {"value": 0, "marker": str(tmp_path / "marker"), "runs": str(runs)}}
    tasks |= {f"t{i}": {"value": i, "runs": str(runs)} for i in range(1, 4)}
    out = run_local(tasks, "node_tasks:die_once", TWO, tmp_path / "a")
    assert out["dies"]["status"] == "ok" and out["dies"]["attempt"] == 2
    assert all(out[f"t{i}"]["status"] == "ok" and out[f"t{i}"]["attempt"] == 1 for i in range(1, 4))
    assert sorted(_runs(runs)) == ["0", "0", "1", "2", "3"]  # "dies" ran twice (the first run died)
    assert sorted(p.name for p in (tmp_path / "a" / "done").iterdir()) == [f"{k}.json" for k in sorted(tasks)]


def test_a_task_that_always_kills_its_worker_is_reported_lost_not_dropped(tmp_path):
    runs = tmp_path / "runs"
    out = run_local({"x": {"value": 9, "runs": str(runs)}}, "node_tasks:die_always", TWO, tmp_path / "a",
                    max_attempts=2)
    assert out["x"]["status"] == "lost" and "died 2 time" in out["x"]["error"]
    assert _runs(runs) == ["9", "9"]


def test_run_tasks_local_refuses_mixed_models_before_starting_any_worker(tmp_path):
    listing = "0, NVIDIA H100, GPU-a\n1, NVIDIA A100, GPU-b\n"
    with pytest.raises(UsageError, match="2 models"):
        run_tasks(engine="local", spec="node_tasks:echo", tasks={"a": {"value": 1}}, wanted="all",
                  root=tmp_path / "pool", listing=listing)
    assert not (tmp_path / "pool").exists()


def test_run_tasks_refuses_an_unknown_engine(tmp_path):
    with pytest.raises(UsageError, match="local, ray"):
        run_tasks(engine="dask", spec="node_tasks:echo", tasks={}, wanted="1", root=tmp_path)


def test_the_ray_engine_without_ray_installed_is_one_line_and_exit_3(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as where the extra is not installed
    with pytest.raises(EnvMissing) as err:
        run_tasks(engine="ray", spec="node_tasks:echo", tasks={"a": {"value": 1}}, wanted="1", root=tmp_path)
    assert err.value.exit_code == EXIT_REFUSED and "pip install 'cutile-perf[ray]'" in err.value.hint
