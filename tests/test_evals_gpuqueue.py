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


def _gpu_run_queued(meta, queue: Path, command: str) -> tuple[threading.Thread, dict]:
    """Call gpu-run from a thread (it blocks until its job is answered) and return once the job is
    queued: (the thread, a dict that gets the finished call under "proc")."""
    result: dict = {}
    caller = threading.Thread(target=lambda: result.update(proc=_gpu_run(meta, command)))
    caller.start()
    for _ in range(200):  # the job file appears once the client has queued it
        if list((queue / gpuqueue.JOBS).glob("*.json")):
            break
        caller.join(0.05)
    return caller, result


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
    caller, result = _gpu_run_queued(meta, queue, command)
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
    caller, _result = _gpu_run_queued(meta, queue, "sleep 1.2")
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
    with pytest.raises(SystemExit) as exc:
        gpuqueue.main(["nonsense"])
    assert exc.value.code == 2


def test_grade_verb_queues_one_grading_job_per_trial_outside_the_agents_quota(trial):
    meta, queue, tmp = trial
    trial_dir = Path(meta["repo"]).parent
    assert gpuqueue.main(["grade", str(queue), str(trial_dir), "--rounds", "2", "--no-reference",
                          "--timeout", "300"]) == 0
    (job,) = [gpuqueue.Job.load(p) for p in (queue / gpuqueue.JOBS).glob("*.json")]
    assert job.trial_dir == str(trial_dir) and "--grade-only" in job.command and "--rounds 2" in job.command
    assert "--no-reference" in job.command and job.grading
    # The grader gets the job's time less a margin, so the job ends with its grades, never cut.
    assert job.timeout_s == 300 and "--budget 270 " in job.command


def test_agent_prompt_lists_the_skill_only_with_it_and_gives_a_path_without_the_cli(tmp_path):
    task = tasks.by_id(tasks.load_tasks(), "rmsnorm-make-faster")
    note = "- Never use the device tools.\n"
    with_skill = cli.prepare_trial(task, tmp_path / "skill-1", skill=True, suffix="", tilegym=None,
                                   gpu_queue=tmp_path / "q", gpu_seconds=180, note=note)
    without = cli.prepare_trial(task, tmp_path / "noskill-1", skill=False, suffix="", tilegym=None,
                                gpu_queue=tmp_path / "q", gpu_seconds=180, note=note)
    text = Path(with_skill["agent_prompt_file"]).read_text()
    plain = Path(without["agent_prompt_file"]).read_text()
    for prompt in (text, plain):
        assert "gpu-run '<shell command>'" in prompt and "at most 180 seconds" in prompt
        assert "- Never use the device tools." in prompt and prompt.rstrip().endswith(task["question"].strip())
    assert "- cutile-perf: Make NVIDIA cuTile" in text and ".claude/skills/cutile-perf/SKILL.md" in text
    assert "cutile-perf" not in plain.replace(task["question"], ""), "nothing names the tool without the skill"
    python_bin = Path(without["repo"]).parent / "python-bin"
    assert sorted(p.name for p in python_bin.iterdir()) == ["pytest", "python", "python3"]
    ran = subprocess.run([str(python_bin / "python"), "-c", "import yaml, git; print('ok')"], capture_output=True,
                         text=True)
    assert ran.stdout.strip() == "ok", ran.stderr


def test_collect_rebuilds_results_from_trial_files_and_splits_agent_and_grading_gpu_time(trial):
    meta, queue, tmp = trial
    trial_dir = Path(meta["repo"]).parent
    out = trial_dir.parent.parent
    assert cli.collect_results(out) == [], "a trial without grade.json is not a result yet"
    (trial_dir / "grade.json").write_text(json.dumps({"task": "rmsnorm-make-faster", "speedup": 1.5, "success": True}))
    (trial_dir / "agent.json").write_text(json.dumps({"wall_s": 600}))
    for n, (command, seconds, grading) in enumerate((("cutile-perf baseline", 30.0, False),
                                                       ("cutile-perf try x", 20.0, False),
                                                       ("python run.py --grade-only .", 60.0, True))):
        (queue / gpuqueue.DONE / f"{n}.json").write_text(json.dumps(
            {"id": str(n), "trial_dir": str(trial_dir), "command": command, "seconds": seconds, "finished": n,
             "grading": grading}))
    (row,) = cli.collect_results(out)
    assert (row["task"], row["mode"], row["trial"]) == ("rmsnorm-make-faster", "skill", 1)
    assert row["gpu"] == {"agent_jobs": 2, "agent_seconds": 50.0, "grading_seconds": 60.0}
    assert row["agent"] == {"wall_s": 600} and row["grade"]["speedup"] == 1.5
    assert cli.main(["--collect", str(out)]) == 0 and "| 600 | 50 |" in (out / "results.md").read_text()


def test_a_batch_defers_the_job_whose_timeout_does_not_fit_and_queues_it_again(trial):
    meta, queue, tmp = trial
    trial_dir = Path(meta["repo"]).parent
    first = gpuqueue.submit(queue, trial_dir, "true", timeout_s=5)
    second = gpuqueue.submit(queue, trial_dir, "true", timeout_s=50)
    assert gpuqueue.pack(queue, tmp / "stage")
    rows = gpuqueue.run_batch(tmp / "stage", tmp / "out-batch", root=tmp / "gpu-machine", budget_s=30)
    assert [r.get("deferred", False) for r in rows] == [False, True]
    gpuqueue.collect(tmp / "out-batch", queue)
    assert (queue / gpuqueue.DONE / f"{first.id}.json").is_file()
    assert (queue / gpuqueue.JOBS / f"{second.id}.json").is_file(), "back in line for the next batch"


def test_the_wrapper_keeps_the_commands_exit_code_when_its_log_cannot_be_written(tmp_path):
    from cutile_perf_evals import shim
    wrapper = shim.write_wrapper(tmp_path / "bin", tmp_path / "missing-dir" / "commands.jsonl")
    proc = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and "could not log this call" in proc.stderr


def test_a_grading_group_is_one_job_that_carries_every_trial_there_and_back(tmp_path):
    task = tasks.by_id(tasks.load_tasks(), "rmsnorm-make-faster")
    queue = tmp_path / "q"
    metas = [cli.prepare_trial(task, tmp_path / "out" / task["id"] / f"skill-{n}", skill=False, suffix="",
                               tilegym=None, gpu_queue=queue) for n in (1, 2)]
    dirs = [Path(m["repo"]).parent for m in metas]
    assert gpuqueue.main(["grade", str(queue), *map(str, dirs), "--group"]) == 0
    (job,) = [gpuqueue.Job.load(p) for p in (queue / gpuqueue.JOBS).glob("*.json")]
    assert job.trials() == [str(d) for d in dirs]
    assert job.command.count("--grade-only") == 1 and all(f"{d}/repo" in job.command for d in dirs)
    # Stand-in for the grading run: it writes into both trials, and both come back.
    job_file = queue / gpuqueue.JOBS / f"{job.id}.json"
    data = json.loads(job_file.read_text())
    # Relative paths: on the GPU machine the trials sit under another root in this test.
    data["command"] = "echo graded > ../grade.json && echo graded > ../../skill-2/grade.json"
    job_file.write_text(json.dumps(data))
    rows = _drain(queue, tmp_path)
    assert rows[0]["exit"] == 0, rows[0]["output"]
    assert all((d / "grade.json").read_text().strip() == "graded" for d in dirs), "both came back from there"
    assert gpuqueue.finished_jobs(queue, str(dirs[1]))[0]["id"] == job.id


def test_grading_a_tilegym_task_carries_its_reference_file_not_the_checkout(tmp_path):
    """The GPU machine gets trial dirs only, and a TileGym checkout does not fit the transport next
    to three trials: the one file the task's reference names travels inside the first trial dir."""
    tilegym = tmp_path / "TileGym"
    source = tilegym / "src/tilegym/ops/cutile/rms_norm.py"
    source.parent.mkdir(parents=True)
    source.write_text("# upstream kernel\n")
    (tilegym / "tests").mkdir()
    (tilegym / "tests/big.py").write_text("x" * 1000)
    dirs = []
    for name in ("skill-1", "skill-2"):
        trial = tmp_path / "out" / name
        (trial / "repo").mkdir(parents=True)
        (trial / "task.json").write_text(json.dumps({"task": "tilegym-rmsnorm-persistent"}))
        dirs.append(trial)
    queue = tmp_path / "q"
    assert gpuqueue.main(["grade", str(queue), *map(str, dirs), "--group", "--tilegym", str(tilegym)]) == 0
    (job,) = [gpuqueue.Job.load(p) for p in (queue / gpuqueue.JOBS).glob("*.json")]
    carried = dirs[0] / gpuqueue.REFERENCE_DIR
    assert f"--tilegym {carried}" in job.command
    assert sorted(str(p.relative_to(carried)) for p in carried.rglob("*") if p.is_file()) == [
        "src/tilegym/ops/cutile/rms_norm.py"]
    assert (carried / "src/tilegym/ops/cutile/rms_norm.py").read_text() == "# upstream kernel\n"
    # Without a reference to time, nothing is carried and no --tilegym is passed.
    assert gpuqueue.main(["grade", str(queue), str(dirs[1]), "--no-reference", "--tilegym", str(tilegym)]) == 0
    assert not (dirs[1] / gpuqueue.REFERENCE_DIR).exists()


def test_grade_only_refuses_a_group_of_different_tasks(tmp_path, capsys):
    repos = []
    for task_id in ("rmsnorm-make-faster", "softmax-make-faster"):
        task = tasks.by_id(tasks.load_tasks(), task_id)
        repos.append(cli.prepare_trial(task, tmp_path / task_id / "skill-1", skill=False, suffix="", tilegym=None)["repo"])
    assert cli.main(["--grade-only", *repos]) == 2
    assert "one task" in capsys.readouterr().err


def test_a_bundled_tasks_own_prepared_steps_are_withheld_through_the_wrapper(tmp_path):
    """The first live run's skill agents copied step 05 of the very kernel they were asked to speed up."""
    task = tasks.by_id(tasks.load_tasks(), "rmsnorm-make-faster")
    meta = cli.prepare_trial(task, tmp_path / "skill-1", skill=True, suffix="", tilegym=None)
    wrapper = str(Path(meta["bin"]) / "cutile-perf")
    shown = subprocess.run([wrapper, "example", "show", "rms_norm", "--step", "05"], cwd=meta["repo"],
                           capture_output=True, text=True)
    assert shown.returncode == 3 and "withheld in this evaluation" in shown.stderr and "ct.kernel" not in shown.stdout
    other = subprocess.run([wrapper, "example", "show", "softmax", "--step", "01"], cwd=meta["repo"],
                           capture_output=True, text=True)
    assert other.returncode == 0 and "ct.kernel" in other.stdout, "other ops' steps stay visible"
    listed = subprocess.run([wrapper, "example", "list"], cwd=meta["repo"], capture_output=True, text=True)
    assert "rms_norm: " in listed.stdout and "prepared steps withheld" in listed.stdout
    plain = subprocess.run([wrapper, "example", "show", "rms_norm"], cwd=meta["repo"], capture_output=True, text=True)
    assert plain.returncode == 0 and "changes:" not in plain.stderr, "no step stories for the op under test"
    shown_ok = cli.prepare_trial(task, tmp_path / "skill-2", skill=True, suffix="", tilegym=None, show_examples=True)
    again = subprocess.run([str(Path(shown_ok["bin"]) / "cutile-perf"), "example", "show", "rms_norm", "--step", "05"],
                           cwd=shown_ok["repo"], capture_output=True, text=True)
    assert again.returncode == 0 and "ct.kernel" in again.stdout


def test_the_gpu_machines_wrapper_withholds_the_same_steps(trial):
    meta, queue, tmp = trial
    gpuqueue.submit(queue, Path(meta["repo"]).parent, "cutile-perf example show rms_norm --step 05", timeout_s=60)
    (row,) = _drain(queue, tmp)
    assert row["exit"] == 3 and "withheld in this evaluation" in row["output"]


def test_a_run_without_the_skill_has_no_cli_on_the_gpu_machine_either(tmp_path):
    task = tasks.by_id(tasks.load_tasks(), "rmsnorm-make-faster")
    queue = tmp_path / "q"
    meta = cli.prepare_trial(task, tmp_path / "out" / task["id"] / "noskill-1", skill=False, suffix="",
                             tilegym=None, gpu_queue=queue)
    gpuqueue.submit(queue, Path(meta["repo"]).parent, "test -e ../bin/cutile-perf && echo wrapper || echo none",
                    timeout_s=30)
    (row,) = _drain(queue, tmp_path)
    assert row["output"].strip().endswith("none"), row["output"]


def test_red_team_an_agent_cannot_escape_its_quota_by_naming_the_grader(trial):
    """Grading jobs do not count against an agent's quota; an agent's own command that merely
    mentions --grade-only (a comment will do) is still the agent's and still counts."""
    meta, queue, tmp = trial
    caller, _result = _gpu_run_queued(meta, queue, "sleep 1.2 # --grade-only")
    _drain(queue, tmp)
    caller.join(60)
    assert gpuqueue.used_seconds(queue, str(Path(meta["repo"]).parent)) >= 1.0


def test_note_file_reaches_the_agent_prompt_and_a_missing_one_is_a_one_line_error(tmp_path, capsys):
    note = tmp_path / "note.txt"
    note.write_text("- Never use the device tools.\n")
    assert cli.main(["--prepare-only", "--task", "rmsnorm-make-faster", "--out", str(tmp_path / "out"),
                     "--note-file", str(note)]) == 0
    (prompt,) = (tmp_path / "out").glob("*/*/agent-prompt.txt")
    assert "- Never use the device tools." in prompt.read_text()
    capsys.readouterr()
    assert cli.main(["--prepare-only", "--task", "rmsnorm-make-faster", "--note-file", str(tmp_path / "nope")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_pack_under_a_byte_limit_leaves_the_jobs_that_do_not_fit_pending(tmp_path):
    """The transport carries a bounded payload (the team's GPU lending tool: 64 MiB in all): a
    batch takes the oldest jobs whose trial dirs fit, the others wait for the next batch."""
    task = tasks.by_id(tasks.load_tasks(), "rmsnorm-make-faster")
    queue = tmp_path / "queue"
    trials = [Path(cli.prepare_trial(task, tmp_path / "out" / f"skill-{i}", skill=True, suffix="", tilegym=None,
                                     gpu_queue=queue, gpu_seconds=60.0)["repo"]).parent for i in (1, 2)]
    first = gpuqueue.submit(queue, trials[0], "true", timeout_s=5)
    second = gpuqueue.submit(queue, trials[1], "true", timeout_s=5)
    one_trial, both = gpuqueue._packed_size([str(trials[0])]), gpuqueue._packed_size([str(t) for t in trials])
    # Trials of one task are copies of one repository: packed together they cost little more than one.
    assert one_trial < both < 1.3 * one_trial
    limit = (one_trial + both) // 2
    packed = gpuqueue.pack(queue, tmp_path / "stage", max_bytes=limit)
    assert [j.id for j in packed] == [first.id]
    assert [p.stem for p in (queue / gpuqueue.JOBS).glob("*.json")] == [second.id]
    assert (tmp_path / "stage" / "trials.tar").stat().st_size <= limit
    # The oldest job always goes, even over the limit: otherwise it would wait forever.
    assert [j.id for j in gpuqueue.pack(queue, tmp_path / "stage2", max_bytes=1)] == [second.id]


def test_a_job_imports_the_repositorys_own_package_as_a_development_install_would(trial):
    """TileGym's tests `import tilegym`; a user's checkout is installed in development mode, so a
    job's own `python -m pytest` must find the repository's src/ too (and the machine's path after it)."""
    meta, queue, tmp = trial
    caller, result = _gpu_run_queued(meta, queue, 'python -c "import tilesuite, sys; print(tilesuite.__file__)"')
    rows = _drain(queue, tmp)
    caller.join(60)
    assert rows[0]["exit"] == 0, rows[0]["output"]
    there = tmp / "gpu-machine" / str(Path(meta["repo"])).lstrip("/") / "src" / "tilesuite" / "__init__.py"
    assert rows[0]["output"].strip().endswith(str(there))


def test_close_answers_waiting_callers_and_refuses_new_jobs_without_touching_the_quota(trial):
    """When the GPU cannot be reached any more (its budget spent), no agent may wait forever."""
    meta, queue, tmp = trial
    caller, result = _gpu_run_queued(meta, queue, "echo never")
    assert gpuqueue.main(["close", str(queue), "device budget spent"]) == 0
    caller.join(60)
    proc = result["proc"]
    assert proc.returncode == 3 and "not run, the GPU machine cannot be reached: device budget spent" in proc.stdout
    assert "never" not in proc.stdout  # it ran nowhere
    assert gpuqueue.used_seconds(queue, str(Path(meta["repo"]).parent)) == 0.0
    later = _gpu_run(meta, "echo again")
    assert later.returncode == 3 and "cannot be reached: device budget spent" in later.stderr
    assert not list((queue / gpuqueue.JOBS).glob("*.json"))


def test_gpu_queue_grade_passes_the_graded_ref_to_the_grader(tmp_path):
    queue = tmp_path / "queue"
    gpuqueue.init_queue(queue, 0.0)
    trial = tmp_path / "trial"
    (trial / "repo").mkdir(parents=True)
    (job,) = gpuqueue.queue_grading(queue, [trial], rounds=1, no_reference=True, timeout_s=100, ref="main")
    assert job.command.endswith("--no-reference --ref main --json")
    (job,) = gpuqueue.queue_grading(queue, [trial], rounds=1, no_reference=True, timeout_s=100)
    assert "--ref" not in job.command
