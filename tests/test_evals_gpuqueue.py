"""The evals' GPU job queue, end to end on one machine (CPU only): an agent's ``gpu-run`` blocks,
the batch is packed, run and collected, and the trial comes back with its commits, its log rows
and its installed skill intact."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "evals"))
from cutile_perf_evals import cli, gpuqueue, tasks  # noqa: E402


@pytest.fixture()
def trial(tmp_path):
    task = tasks.by_id(tasks.load_tasks(), "rmsnorm-make-faster")
    queue = tmp_path / "queue"
    meta = cli.prepare_trial(task, tmp_path / "out" / task["id"] / "skill-1", skill=True, suffix="",
                             tilegym=None, gpu_queue=queue, gpu_seconds=60.0)
    return meta, queue, tmp_path


def _gpu_run(meta, *args):
    env = dict(os.environ, PATH=os.pathsep.join([meta["bin"], os.environ["PATH"]]))
    return subprocess.run([str(Path(meta["bin"]) / "gpu-run"), *args], cwd=meta["repo"], env=env,
                          capture_output=True, text=True, timeout=120)


def _drain(queue: Path, work: Path) -> list[dict]:
    """What the team's transport does: pack here, run there (here too, in the test), collect here."""
    assert gpuqueue.pack(queue, work / "stage")
    gpuqueue.run_batch(work / "stage", work / "out-batch", root=work / "gpu-machine")
    return gpuqueue.collect(work / "out-batch", queue)


def test_job_runs_in_the_trial_repo_and_its_commit_comes_back(trial):
    meta, queue, tmp = trial
    repo = Path(meta["repo"])
    kernel = repo / "src/tilesuite/ops/cutile/rms_norm.py"
    kernel.write_text(kernel.read_text() + "\n# uncommitted edit made before the call\n")
    command = ("grep -q 'uncommitted edit' src/tilesuite/ops/cutile/rms_norm.py && git commit -qam 'made there' "
               "&& cutile-perf --help > /dev/null && echo ran-on-gpu")
    result = {}
    caller = threading.Thread(target=lambda: result.update(proc=_gpu_run(meta, command)))
    caller.start()
    for _ in range(200):  # the job file appears once the client has queued it
        if list((queue / gpuqueue.JOBS).glob("*.json")):
            break
        caller.join(0.05)
    rows = _drain(queue, tmp)
    caller.join(60)
    proc = result["proc"]
    assert proc.returncode == 0, proc.stderr
    assert "ran-on-gpu" in proc.stdout and "of GPU time left" in proc.stderr
    assert rows[0]["exit"] == 0
    log = subprocess.run(["git", "log", "-1", "--format=%s"], cwd=repo, capture_output=True, text=True).stdout
    assert log.strip() == "made there", "the commit made on the GPU machine is in the local repository"
    assert (repo / ".claude/skills/cutile-perf/SKILL.md").is_file(), "the installed skill stays"
    calls = [json.loads(line) for line in Path(meta["commands_log"]).read_text().splitlines()]
    assert [c["argv"] for c in calls] == [["--help"]], "the wrapper's rows from there are merged here"
    assert not (Path(meta["repo"]).parent / gpuqueue.GPU_LOG).exists()


def test_a_file_deleted_here_between_batches_does_not_come_back(trial):
    meta, queue, tmp = trial
    repo = Path(meta["repo"])
    gpuqueue.submit(queue, repo.parent, "echo scratch > scratch.txt", timeout_s=30)
    _drain(queue, tmp)
    assert (repo / "scratch.txt").is_file()
    (repo / "scratch.txt").unlink()
    gpuqueue.submit(queue, repo.parent, "test ! -e scratch.txt", timeout_s=30)
    rows = _drain(queue, tmp)
    assert rows[0]["exit"] == 0 and not (repo / "scratch.txt").exists()
    calls = Path(meta["commands_log"])
    assert not calls.exists() or not calls.read_text().strip(), "no wrapper rows are merged twice"


def test_quota_is_shared_by_a_trials_jobs_and_then_refuses(trial):
    meta, queue, tmp = trial
    caller = threading.Thread(target=lambda: _gpu_run(meta, "sleep 1.2"))
    caller.start()
    for _ in range(200):
        if list((queue / gpuqueue.JOBS).glob("*.json")):
            break
        caller.join(0.05)
    _drain(queue, tmp)
    caller.join(60)
    assert gpuqueue.used_seconds(queue, str(Path(meta["repo"]).parent)) >= 1.0
    (queue / gpuqueue.QUOTA_FILE).write_text(json.dumps({"gpu_seconds": 1.0}))
    refused = _gpu_run(meta, "true")
    assert refused.returncode == 2 and "used up" in refused.stderr
    assert not list((queue / gpuqueue.JOBS).glob("*.json")), "a refused call queues nothing"


def test_job_timeout_kills_the_command_and_reports_124(trial):
    meta, queue, tmp = trial
    job = gpuqueue.submit(queue, Path(meta["repo"]).parent, "sleep 30", timeout_s=0.5)
    rows = _drain(queue, tmp)
    assert rows[0]["timed_out"] and rows[0]["seconds"] < 10
    done = json.loads((queue / gpuqueue.DONE / f"{job.id}.json").read_text())
    assert done["timed_out"] and not list((queue / gpuqueue.RUNNING).glob("*.json"))


def test_pack_with_nothing_queued_says_so(tmp_path):
    queue = gpuqueue.init_queue(tmp_path / "q", 10)
    assert gpuqueue.pack(queue, tmp_path / "stage") == []
    assert gpuqueue.main(["pack", str(queue), str(tmp_path / "stage")]) == 1
    assert gpuqueue.main(["nonsense"]) == 2
