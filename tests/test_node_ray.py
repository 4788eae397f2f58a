"""node.ray_engine on a local Ray cluster that declares two simulated GPUs (no GPU needed): tasks
spread over both (probe and screen among them), a worker killed mid-task (``ray.kill``) has its task re-run and recorded once.
Skipped where Ray is not installed (the optional ``ray`` extra: pip install -e '.[ray]')."""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cutile_perf.errors import UsageError
from cutile_perf.node.ray_engine import NAMESPACE, cluster_gpus, run_ray

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster():
    """One small local cluster for the whole module: Ray's start-up is the slow part."""
    scripts = TESTS.parent / "scripts"
    # Ray's sockets live under its temp folder, and a Unix socket path may not exceed 107 bytes:
    # pytest-xdist's per-worker temp folders made it too long (OSError at ray.init), so a short one.
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(num_cpus=2, num_gpus=2, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{scripts}:{TESTS}:{TESTS.parent}"}}, _temp_dir=short)
    yield ray
    ray.shutdown()
    shutil.rmtree(short, ignore_errors=True)


def _runs(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split() if path.exists() else []


def test_tasks_spread_over_two_simulated_gpus_each_actor_seeing_one(cluster, tmp_path):
    runs = tmp_path / "runs"
    tasks = {f"t{i}": {"value": i, "sleep": 0.5, "runs": str(runs)} for i in range(6)}
    out = run_ray(tasks, "node_tasks:echo", 2, tmp_path / "pool")
    assert {k: v["result"]["value"] for k, v in out.items()} == {f"t{i}": i for i in range(6)}
    assert {v["result"]["device"] for v in out.values()} == {"0", "1"}  # Ray gave each actor one GPU
    assert len({v["worker"] for v in out.values()}) == 2
    assert sorted(_runs(runs)) == [str(i) for i in range(6)]


def test_probe_spread_over_the_cluster_ranks_as_one_process_does(cluster):
    """``probe --engine ray``: each shape on one actor, the fake tunable and timings of
    tests/test_tune_commands.py imported there by name."""
    from cutile_perf.commands.probe import probe  # noqa: PLC0415 - only this test needs the tuner

    target, fakes, dims = "tests.test_tune_commands:FAKE_TUNABLE", "tests.test_tune_commands:fakes", ["TILE=64,128"]
    one = probe(target=target, dims=dims, shapes=None, fakes=fakes)
    two = probe(target=target, dims=dims, shapes=None, fakes=fakes, gpus="2", engine="ray")
    assert two.data["ranked"] == one.data["ranked"] and two.data["keep"] == one.data["keep"]


def test_a_worker_killed_mid_task_has_its_task_rerun_and_recorded_once(cluster, tmp_path):
    runs, marker = tmp_path / "runs", tmp_path / "marker"
    tasks = {"hangs": {"value": 0, "marker": str(marker), "runs": str(runs)}}
    tasks |= {f"t{i}": {"value": i, "runs": str(runs)} for i in range(1, 4)}
    out: dict = {}
    driver = threading.Thread(target=lambda: out.update(run_ray(tasks, "node_tasks:hang_once", 2, tmp_path / "p")))
    driver.start()
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    victim = marker.read_text(encoding="utf-8")  # the actor running "hangs", mid-task
    ray.kill(ray.get_actor(victim, namespace=NAMESPACE))
    driver.join(timeout=180)
    assert not driver.is_alive()
    assert out["hangs"]["status"] == "ok" and out["hangs"]["attempt"] == 2 and out["hangs"]["worker"] != victim
    assert all(out[f"t{i}"]["status"] == "ok" for i in range(1, 4))
    assert sorted(_runs(runs)) == ["0", "0", "1", "2", "3"]  # "hangs" ran twice: its first run was killed
    assert sorted(p.name for p in (tmp_path / "p" / "done").iterdir()) == [f"{k}.json" for k in sorted(tasks)]


def test_cluster_gpus_refuses_mixed_models_and_counts_past_the_cluster():
    with pytest.raises(UsageError, match=r"2 models \(A100, H100\)"):
        cluster_gpus({"GPU": 4, "accelerator_type:H100": 1, "accelerator_type:A100": 1}, "all")
    with pytest.raises(UsageError, match="offers 2"):
        cluster_gpus({"GPU": 2}, "3")
    with pytest.raises(UsageError, match="no GPU"):
        cluster_gpus({"CPU": 8}, "all")
    assert cluster_gpus({"GPU": 8.0, "accelerator_type:H100": 1}, "all") == 8
    assert cluster_gpus({"GPU": 8.0}, "3") == 3


def test_screen_spread_over_the_cluster_ranks_as_one_process_does(cluster, tmp_path):
    """``screen --engine ray``: each group of candidates on one actor (its one simulated GPU), the
    ranking that of one process (tests/test_screen_spread.py)."""
    from redteam_helpers import call  # noqa: PLC0415 - the simulated repo's helpers, only here
    from test_screen import baselined_with_candidates  # noqa: PLC0415
    from test_screen_spread import EXPECTED_RATIO, LATENCY  # noqa: PLC0415

    repo, _cand = baselined_with_candidates(tmp_path, LATENCY)
    code, data, text = call(repo, "screen", "sandbox/cand/*.py", "--gpus", "2", "--engine", "ray")
    assert code == 0, text
    assert [r["name"] for r in data["ranked"]] == ["fast", "slow"]
    for reading in data["ranked"]:
        assert reading["geomean"] == pytest.approx(EXPECTED_RATIO[reading["name"]], rel=0.05)
    workers = data["workers"]
    assert sorted(workers) == ["fast", "slow"] and len(set(workers.values())) == 2, workers
    assert all(w.startswith("cutile-perf-") for w in workers.values()), workers  # Ray's actors (_Actors.new)
    assert data["not_ranked"]["wrong"]["state"] == "fails correctness"
