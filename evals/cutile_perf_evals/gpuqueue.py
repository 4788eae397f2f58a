"""A GPU job queue for agents that work on a machine without a GPU.

The agent under test runs where the code is (no GPU); the GPU is another machine that only a
transport can reach (ssh, a batch scheduler, or the lending tool of the team's sandbox). The
agent calls ``gpu-run '<command>'`` from its trial's ``bin/``; the command is queued and the call
blocks. Whoever holds the GPU drains the queue in batches:

    python evals/gpu_queue.py pack QUEUE STAGE        # here: pending jobs + their trial dirs -> STAGE
    python evals/gpu_queue.py run-batch STAGE OUT     # on the GPU machine: run them, pack the results
    python evals/gpu_queue.py collect OUT QUEUE       # here: trial dirs updated, callers released
    python evals/gpu_queue.py close QUEUE 'REASON'    # the GPU is gone: waiting callers answered, new ones refused

On the GPU machine each trial directory is unpacked at the same absolute path as here, so a
session's frozen paths and the repository's git state mean the same on both sides; the job runs
in the trial's repository with a ``cutile-perf`` wrapper for that machine first on PATH. What
comes back replaces the repository (files and ``.git``; the installed skill directories stay) and
the wrapper's log rows are appended to the trial's ``commands.jsonl``, so the grader sees every
call wherever it ran. A trial's jobs share one GPU-seconds quota (``gpu_seconds`` in the queue's
``quota.json``), the same for every agent, with the skill or without.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cutile_perf.store import atomic
from cutile_perf.child import runner
from cutile_perf_evals import CHECKOUT, build, shim

JOBS, RUNNING, DONE = "jobs", "running", "done"
QUOTA_FILE = "quota.json"
CLOSED_FILE = "closed.txt"  # the reason the GPU cannot be reached any more (``close``)
GPU_LOG = "commands.gpu.jsonl"  # the wrapper's log on the GPU machine; merged into commands.jsonl
KEEP_LOCAL = (".claude", ".agents")  # installed skill directories: read here, never needed there
SKIP_IN_TRIAL = ("bin", "agent.stdout", "agent.stderr")  # this machine's wrapper and transcript
OUTPUT_TAIL = 30_000
DEFAULT_JOB_TIMEOUT_S = 300.0

CLIENT = '''\
#!{python}
# Written by cutile-perf's eval runner: queue a command for the GPU machine and wait for it.
import sys
sys.path[:0] = [{evals!r}, {scripts!r}]
from cutile_perf_evals.gpuqueue import client_main
raise SystemExit(client_main(sys.argv[1:], queue={queue!r}, trial_dir={trial!r}))
'''


@dataclass(frozen=True)
class Job:
    id: str
    trial_dir: str  # absolute, the same on both machines; the job runs in its repo
    command: str
    timeout_s: float
    submitted: float
    also: tuple[str, ...] = ()  # other trial dirs the job reads and writes (a grading group)
    # Set only by queue_grading, never by gpu-run: a grading job is outside the agent's quota, so
    # what makes one must not be something the agent can type into its command.
    grading: bool = False

    @classmethod
    def from_dict(cls, data: dict) -> "Job":
        return cls(**{k: data[k] for k in ("id", "trial_dir", "command", "timeout_s", "submitted")},
                   also=tuple(data.get("also") or ()), grading=bool(data.get("grading")))

    @classmethod
    def load(cls, path: Path) -> "Job":
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    def to_dict(self) -> dict:
        return {"id": self.id, "trial_dir": self.trial_dir, "command": self.command, "timeout_s": self.timeout_s,
                "submitted": self.submitted, "also": list(self.also), "grading": self.grading}

    def trials(self) -> list[str]:
        return [self.trial_dir, *self.also]


def init_queue(queue: Path, gpu_seconds: float) -> Path:
    for name in (JOBS, RUNNING, DONE):
        (queue / name).mkdir(parents=True, exist_ok=True)
    if not (queue / QUOTA_FILE).is_file():
        atomic.write_text(queue / QUOTA_FILE, json.dumps({"gpu_seconds": gpu_seconds}) + "\n")
    return queue


def write_client(bin_dir: Path, queue: Path, trial_dir: Path) -> Path:
    """Write ``bin_dir/gpu-run`` for one trial (executable); returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "gpu-run"
    path.write_text(CLIENT.format(python=sys.executable, evals=str(CHECKOUT / "evals"),
                                  scripts=str(shim.scripts_dir()), queue=str(queue), trial=str(trial_dir)),
                    encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def finished_jobs(queue: Path, trial_dir: str) -> list[dict]:
    """The trial's finished jobs (id, command, exit, timed_out, seconds, output), in finishing order."""
    rows = [json.loads(p.read_text(encoding="utf-8")) for p in (queue / DONE).glob("*.json")]
    mine = (r for r in rows if r.get("trial_dir") == trial_dir or trial_dir in (r.get("also") or ()))
    return sorted(mine, key=lambda r: r.get("finished") or 0)


def is_grading(job: dict) -> bool:
    return bool(job.get("grading"))


def used_seconds(queue: Path, trial_dir: str) -> float:
    """GPU seconds the agent's finished jobs took (grading jobs are not the agent's)."""
    return sum(float(r.get("seconds") or 0.0) for r in finished_jobs(queue, trial_dir) if not is_grading(r))


def quota(queue: Path) -> float:
    return float(json.loads((queue / QUOTA_FILE).read_text(encoding="utf-8"))["gpu_seconds"])


def submit(queue: Path, trial_dir: Path, command: str, timeout_s: float, also: tuple[Path, ...] = (),
           grading: bool = False) -> Job:
    job = Job(f"{time.time_ns()}-{os.getpid()}", str(trial_dir), command, timeout_s, time.time(),
              tuple(str(t) for t in also), grading)
    atomic.write_text(queue / JOBS / f"{job.id}.json", json.dumps(job.to_dict()) + "\n")
    return job


def wait(queue: Path, job: Job, poll_s: float = 2.0) -> dict:
    path = queue / DONE / f"{job.id}.json"
    while not path.is_file():
        time.sleep(poll_s)
    return json.loads(path.read_text(encoding="utf-8"))


def client_main(argv: list[str], *, queue: str, trial_dir: str) -> int:
    """``gpu-run [--timeout S] COMMAND...``: run COMMAND in this repository on the GPU machine."""
    timeout = DEFAULT_JOB_TIMEOUT_S
    if argv[:1] == ["--timeout"] and len(argv) >= 2:
        try:
            timeout = float(argv[1])
        except ValueError:
            print(f"gpu-run: --timeout needs seconds, not {argv[1]!r}", file=sys.stderr)
            return 2
        argv = argv[2:]
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: gpu-run [--timeout SECONDS] 'COMMAND'\n"
              "Runs COMMAND with bash in a copy of this repository on the GPU machine (same path, same files,\n"
              "same git state, uncommitted changes included); the repository comes back when it ends.\n"
              f"Jobs are queued, so a call can wait minutes. Default timeout {DEFAULT_JOB_TIMEOUT_S:g} s.",
              file=sys.stderr)
        return 0 if argv else 2
    root = Path(queue)
    if (root / CLOSED_FILE).is_file():
        print(f"gpu-run: the GPU machine cannot be reached: {closed_reason(root)}", file=sys.stderr)
        return 3
    left = quota(root) - used_seconds(root, trial_dir)
    if left <= 1.0:
        print(f"gpu-run: this task's GPU time ({quota(root):g} s) is used up", file=sys.stderr)
        return 2
    job = submit(root, Path(trial_dir), " ".join(argv), min(timeout, left))
    print(f"gpu-run: queued (timeout {job.timeout_s:.0f} s, {left:.0f} s of GPU time left); waiting for the "
          "GPU machine...", file=sys.stderr, flush=True)
    done = wait(root, job)
    sys.stdout.write(done.get("output", ""))
    sys.stdout.flush()
    if done.get("closed"):
        return 3
    status = "timed out" if done.get("timed_out") else f"exit {done.get('exit')}"
    print(f"gpu-run: {status} after {float(done.get('seconds') or 0):.1f} s; "
          f"{quota(root) - used_seconds(root, trial_dir):.0f} s of GPU time left", file=sys.stderr)
    code = done.get("exit")
    return 124 if done.get("timed_out") else (code if isinstance(code, int) else 1)


def _trial_filter(top: str):
    """tarfile filter: a trial dir without this machine's wrapper, transcript or skill copies."""
    skipped = {f"{top}/{name}" for name in SKIP_IN_TRIAL} | {f"{top}/repo/{name}" for name in KEEP_LOCAL}

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if any(info.name == s or info.name.startswith(s + "/") for s in skipped):
            return None
        return info
    return keep


def _add_trial(tar: tarfile.TarFile, trial_dir: str, source: Path | None = None) -> None:
    """Add ``trial_dir`` (absolute) under its own path, read from ``source`` (default: that path)."""
    top = trial_dir.lstrip("/")
    tar.add(str(source or trial_dir), arcname=top, filter=_trial_filter(top))


# xz at preset 9 has a 64 MiB window, so trials of one task (copies of one repository) compress to
# little more than one of them: three TileGym trials took 1.4 MB, against 4.8 MB with gzip.
_COMPRESSION = {"mode": "w:xz", "preset": 9}


def _open_stage(fileobj_or_path) -> tarfile.TarFile:
    if isinstance(fileobj_or_path, (str, Path)):
        return tarfile.open(fileobj_or_path, **_COMPRESSION)
    return tarfile.open(fileobj=fileobj_or_path, **_COMPRESSION)


def _packed_size(trial_dirs: list[str]) -> int:
    """Bytes these trial dirs take together in the compressed stage."""
    with tempfile.TemporaryFile() as raw:
        with _open_stage(raw) as tar:
            for trial in trial_dirs:
                _add_trial(tar, trial)
        return raw.tell()


def _jobs_that_fit(jobs: list[Job], max_bytes: int) -> list[Job]:
    """The oldest jobs whose trial dirs fit in ``max_bytes`` of stage; always at least the oldest
    (a trial bigger than the limit would otherwise wait forever). The rest stay pending."""
    trials: list[str] = []
    chosen: list[Job] = []
    for job in jobs:
        new = [t for t in job.trials() if t not in trials]
        if chosen and new and _packed_size([*trials, *new]) > max_bytes:
            continue  # a later, smaller job may still fit; this one goes first next batch
        trials += new
        chosen.append(job)
    return chosen


def pack(queue: Path, stage: Path, max_bytes: int | None = None) -> list[Job]:
    """Move the pending jobs to ``running/`` and write ``STAGE/{batch.json,trials.tar}``; [] when none.

    ``max_bytes`` bounds the compressed trial dirs (the transport may carry only so much): jobs
    that do not fit stay pending for the next batch.
    """
    jobs = sorted((Job.load(p) for p in (queue / JOBS).glob("*.json")), key=lambda j: j.submitted)
    if max_bytes is not None:
        jobs = _jobs_that_fit(jobs, max_bytes)
    if not jobs:
        return []
    stage.mkdir(parents=True, exist_ok=True)
    with _open_stage(stage / "trials.tar") as tar:
        for trial in dict.fromkeys(t for j in jobs for t in j.trials()):
            _add_trial(tar, trial)
    atomic.write_text(stage / "batch.json", json.dumps([j.to_dict() for j in jobs], indent=1) + "\n")
    for job in jobs:
        os.replace(queue / JOBS / f"{job.id}.json", queue / RUNNING / f"{job.id}.json")
    return jobs


def _extract(tar_path: Path, dest: Path) -> None:
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="tar")


def _job_pythonpath(repo: Path) -> str:
    """The repository's ``src/`` first, then the machine's own path: a user's checkout is installed
    in development mode, so ``import tilegym`` works from its tests. Without this, agents on the
    second live run lost jobs to "No module named 'tilegym'" in their own pytest calls (cutile-perf's
    children were fine: it puts a checkout's package roots on the path itself)."""
    own = [str(repo / "src")] if (repo / "src").is_dir() else []
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([*own, *([inherited] if inherited else [])])


def run_batch(stage: Path, out: Path, root: Path = Path("/"), budget_s: float | None = None) -> list[dict]:
    """On the GPU machine: unpack the trials at their own paths, run each job, pack the trials back.

    ``root`` is ``/`` in use (a trial lives at the same absolute path on both machines); a test
    that plays both machines on one passes another root. A trial left by an earlier batch on a
    still-warm machine is removed first: what the agent deleted here must not come back.
    ``budget_s`` bounds the batch (the transport's own limit): a job whose timeout no longer fits
    is not started and goes back to the queue (``deferred``), so the batch always ends in time.
    """
    start = time.monotonic()
    jobs = [Job.from_dict(row) for row in json.loads((stage / "batch.json").read_text(encoding="utf-8"))]
    trials = {t: root / t.lstrip("/") for t in dict.fromkeys(t for j in jobs for t in j.trials())}
    for there in trials.values():
        shutil.rmtree(there, ignore_errors=True)
    _extract(stage / "trials.tar", root)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for job in jobs:
        if budget_s is not None and time.monotonic() - start + job.timeout_s > budget_s:
            results.append({"id": job.id, "trial_dir": job.trial_dir, "deferred": True})
            print(f"job {job.id}: deferred (its timeout does not fit the batch's budget)", file=sys.stderr)
            continue
        trial = trials[job.trial_dir]
        bin_dir = trial / "bin"
        meta = json.loads((trial / "task.json").read_text(encoding="utf-8")) if (trial / "task.json").is_file() else {}
        if meta.get("cli", True):  # a run without the skill has no CLI here either
            shim.write_wrapper(bin_dir, trial / GPU_LOG, withhold=tuple(meta.get("withhold_examples") or ()))
        log = trial / "gpu-jobs" / f"{job.id}.log"
        env = {"PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
               "CUTILE_PERF_CHECKOUT": str(CHECKOUT), "PYTHONPATH": _job_pythonpath(trial / "repo")}
        print(f"job {job.id}: {job.command[:200]}", file=sys.stderr, flush=True)
        result = runner.run(["bash", "-c", job.command], cwd=trial / "repo", timeout_s=job.timeout_s,
                            output_path=log, env_overrides=env)
        text = log.read_text(encoding="utf-8", errors="replace")
        results.append({"id": job.id, "trial_dir": job.trial_dir, "also": list(job.also), "grading": job.grading,
                        "command": job.command,
                        "exit": result.returncode, "timed_out": result.timed_out,
                        "seconds": round(result.duration_s, 2), "output": text[-OUTPUT_TAIL:],
                        "finished": time.time()})
        print(f"job {job.id}: exit {result.returncode} in {result.duration_s:.1f} s", file=sys.stderr, flush=True)
    with _open_stage(out / "trials-out.tar") as tar:
        for trial, there in trials.items():
            shutil.rmtree(there / "bin", ignore_errors=True)
            _add_trial(tar, trial, there)
    atomic.write_text(out / "done.json", json.dumps(results, indent=1) + "\n")
    return results


def _replace_repo(repo: Path, new_repo: Path) -> None:
    """``repo`` becomes ``new_repo`` (files and .git), keeping the local skill directories."""
    for entry in list(repo.iterdir()):
        if entry.name in KEEP_LOCAL:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for entry in new_repo.iterdir():
        if entry.name not in KEEP_LOCAL:
            shutil.move(str(entry), str(repo / entry.name))


def collect(out: Path, queue: Path) -> list[dict]:
    """Here: put what the GPU machine sent back in place, then release the waiting callers."""
    results = json.loads((out / "done.json").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="gpu-queue-") as tmp:
        _extract(out / "trials-out.tar", Path(tmp))
        for trial in dict.fromkeys(t for r in results for t in [r["trial_dir"], *(r.get("also") or [])]):
            came = Path(tmp) / trial.lstrip("/")
            here = Path(trial)
            _replace_repo(here / "repo", came / "repo")
            gpu_rows = came / GPU_LOG
            if gpu_rows.is_file():
                with (here / "commands.jsonl").open("a", encoding="utf-8") as f:
                    f.write(gpu_rows.read_text(encoding="utf-8"))
            for entry in came.iterdir():  # grade.json, grade-logs/, gpu-jobs/: theirs is newer
                if entry.name in ("repo", GPU_LOG, "commands.jsonl", "task.json"):
                    continue
                target = here / entry.name
                if target.is_dir():
                    shutil.rmtree(target)
                shutil.move(str(entry), str(target))
    for row in results:
        if row.get("deferred"):  # back in line for the next batch
            os.replace(queue / RUNNING / f"{row['id']}.json", queue / JOBS / f"{row['id']}.json")
            continue
        atomic.write_text(queue / DONE / f"{row['id']}.json", json.dumps(row) + "\n")
        (queue / RUNNING / f"{row['id']}.json").unlink(missing_ok=True)
    return results


GRADE_COMMAND = ('python "$CUTILE_PERF_CHECKOUT/evals/run.py" --grade-only {repos} --rounds {rounds}'
                 ' --budget {budget:g}{extra} --json')
# What a grading job keeps of its timeout for the grader's own start and for writing the grades: the
# rest is the grader's --budget, so the job ends with its grades instead of being cut (once, a
# 300 s job timing five trees for 3 rounds was cut after 2, and only its logs came back).
GRADE_MARGIN_S = 30.0


def closed_reason(queue: Path) -> str:
    return (queue / CLOSED_FILE).read_text(encoding="utf-8").strip()


def close(queue: Path, reason: str) -> list[str]:
    """The GPU cannot be reached any more (the transport is gone, its budget spent): refuse new
    jobs and answer every pending or running one, so no caller waits forever. Returns their ids.

    A closed job ran nowhere: exit None, 0 seconds (the agent's quota is untouched), ``closed``
    true, and the reason as its output."""
    atomic.write_text(queue / CLOSED_FILE, reason.strip() + "\n")
    ids = []
    for folder in (JOBS, RUNNING):
        for path in sorted((queue / folder).glob("*.json")):
            job = Job.load(path)
            row = {**job.to_dict(), "exit": None, "timed_out": False, "seconds": 0.0, "closed": True,
                   "finished": time.time(), "output": f"gpu-run: not run, the GPU machine cannot be reached: {reason}\n"}
            atomic.write_text(queue / DONE / f"{job.id}.json", json.dumps(row) + "\n")
            path.unlink()
            ids.append(job.id)
    return ids


def wait_for_jobs(queue: Path, window_s: float, poll_s: float = 2.0) -> None:
    """Block until a job is pending, then ``window_s`` more so that other agents' jobs join the batch."""
    while not any((queue / JOBS).glob("*.json")):
        time.sleep(poll_s)
    time.sleep(window_s)


REFERENCE_DIR = "tilegym-reference"  # in a trial dir: the TileGym files its task's reference names


def _carry_tilegym_reference(trial_dir: Path, tilegym: Path) -> Path:
    """Copy the ``tilegym:`` files that the trial's task names as its reference into the trial dir,
    at their TileGym paths, and return that folder: the GPU machine gets trial dirs only, and a
    whole TileGym checkout does not fit the transport next to them."""
    from cutile_perf_evals import tasks  # noqa: PLC0415 - only grading with a reference needs the task list

    meta = json.loads((trial_dir / "task.json").read_text(encoding="utf-8"))
    task = tasks.by_id(tasks.load_tasks(), meta["task"])
    dest = trial_dir / REFERENCE_DIR
    for spec in tasks.reference(task).values():
        if spec.startswith("tilegym:"):
            target = dest / spec.split(":", 1)[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(build.resolve_source(spec, tilegym), target)
    return dest


def queue_grading(queue: Path, trial_dirs: list[Path], *, rounds: int, no_reference: bool,
                  timeout_s: float, group: bool = False, tilegym: Path | None = None, ref: str = "HEAD") -> list[Job]:
    """Grading jobs, run on the GPU machine like an agent's job (never counted in the agent's quota):
    one per trial, or with ``group`` one for all (same task: one shared base and reference).
    ``tilegym``: the checkout a ``tilegym:`` reference is read from (copied into the job's trial dir).
    ``ref``: the commit graded in each repository (``run.py --ref``)."""
    extra = (" --no-reference" if no_reference else "") + (f" --ref {shlex.quote(ref)}" if ref != "HEAD" else "")
    dirs = [Path(t).resolve() for t in trial_dirs]

    def command(ds: list[Path]) -> str:
        more = extra
        if tilegym is not None and not no_reference:
            more += f" --tilegym {shlex.quote(str(_carry_tilegym_reference(ds[0], Path(tilegym).resolve())))}"
        return GRADE_COMMAND.format(repos=" ".join(shlex.quote(str(d / "repo")) for d in ds), rounds=rounds,
                                    budget=max(timeout_s - GRADE_MARGIN_S, timeout_s / 2), extra=more)
    if group:
        return [submit(queue, dirs[0], command(dirs), timeout_s, also=tuple(dirs[1:]), grading=True)]
    return [submit(queue, d, command([d]), timeout_s, grading=True) for d in dirs]


def _parser():
    import argparse  # noqa: PLC0415 - only the command line needs it

    p = argparse.ArgumentParser(prog="python evals/gpu_queue.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    pk = sub.add_parser("pack", help="move the pending jobs and their trial dirs into STAGE (exit 1: none)")
    pk.add_argument("queue", type=Path)
    pk.add_argument("stage", type=Path)
    pk.add_argument("--wait", type=float, metavar="WINDOW_S",
                    help="first block until a job is pending, then wait WINDOW_S seconds for more")
    pk.add_argument("--max-bytes", type=int, help="at most this many compressed bytes of trial dirs; jobs that "
                    "do not fit stay pending (the oldest job always goes)")
    rb = sub.add_parser("run-batch", help="on the GPU machine: run STAGE's jobs, write the results to OUT")
    rb.add_argument("stage", type=Path)
    rb.add_argument("out", type=Path)
    rb.add_argument("--budget", type=float, help="seconds for the batch; a job whose timeout does not fit is deferred")
    co = sub.add_parser("collect", help="put OUT (what run-batch wrote) in place and release the callers")
    co.add_argument("out", type=Path)
    co.add_argument("queue", type=Path)
    gr = sub.add_parser("grade", help="queue a grading job for each trial dir")
    gr.add_argument("queue", type=Path)
    gr.add_argument("trials", type=Path, nargs="+")
    gr.add_argument("--rounds", type=int, default=3)
    gr.add_argument("--no-reference", action="store_true")
    gr.add_argument("--timeout", type=float, default=300.0)
    gr.add_argument("--group", action="store_true", help="one job for all the trials (of one task): shared base timing")
    gr.add_argument("--tilegym", type=Path, help="TileGym checkout for a tilegym: reference (its files travel with the job)")
    gr.add_argument("--ref", default="HEAD", help="the commit graded (main for live runs: their note says so)")
    cl = sub.add_parser("close", help="the GPU cannot be reached any more: answer every waiting job, refuse new ones")
    cl.add_argument("queue", type=Path)
    cl.add_argument("reason")
    st = sub.add_parser("status", help="how many jobs are pending, running and done")
    st.add_argument("queue", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        if a.verb == "status":
            for name in (JOBS, RUNNING, DONE):
                print(f"{name}: {len(list((a.queue / name).glob('*.json')))}")
            return 0
        if a.verb == "pack":
            if a.wait is not None:
                wait_for_jobs(a.queue, a.wait)
            jobs = pack(a.queue, a.stage, a.max_bytes)
            for job in jobs:
                print(f"{job.trial_dir} | {job.command[:200]}")
            print(f"{len(jobs)} job(s) packed into {a.stage}" if jobs else "no pending jobs")
            return 0 if jobs else 1
        if a.verb == "run-batch":
            rows = run_batch(a.stage, a.out, budget_s=a.budget)
            print(json.dumps([{k: r.get(k) for k in ("id", "exit", "timed_out", "seconds", "deferred")} for r in rows]))
            return 0
        if a.verb == "close":
            ids = close(a.queue, a.reason)
            print(f"queue closed; {len(ids)} waiting job(s) answered")
            return 0
        if a.verb == "grade":
            jobs = queue_grading(a.queue, a.trials, rounds=a.rounds, no_reference=a.no_reference, timeout_s=a.timeout,
                                 group=a.group, tilegym=a.tilegym, ref=a.ref)
            print(f"{len(jobs)} grading job(s) queued")
            return 0
        rows = collect(a.out, a.queue)
        print(f"{len(rows)} job(s) collected")
        return 0
    except (OSError, KeyError, ValueError, tarfile.TarError, build.BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
