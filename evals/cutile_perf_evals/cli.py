"""``python evals/run.py``: build task repos, run an agent on each, grade by measurement.

Examples:
  python evals/run.py --list
  python evals/run.py --task rmsnorm-make-faster --agent 'claude -p "$(cat {prompt_file})"' --trials 2
  python evals/run.py --task rmsnorm-make-faster --agent '...' --no-skill
  python evals/run.py --prepare-only --task rmsnorm-make-faster          # prints the prompt file's path
  python evals/run.py --grade-only /tmp/x/rmsnorm-make-faster/skill-1/repo
  python evals/run.py grade <repo> --task rmsnorm-make-faster            # same as --grade-only
  python evals/run.py --measure-references --kind optimization           # start vs reference, no agent

Exit codes:
  0  done (--grade-only: the trial succeeded)
  1  --grade-only: graded, not a success
  2  usage error (unknown task, bad template, missing TileGym checkout)
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from cutile_perf.judge import stats
from cutile_perf_evals import agent, agent_prompt, build, grade, gpuqueue, measure, report, shim, tasks

TRANSCRIPT_CHARS = 2_000_000  # enough to find the skill's path in a stream-json transcript


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python evals/run.py", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]) + "\n\nPlaceholders of --agent:\n  "
                                + " ".join("{" + n + "}" for n in agent.PLACEHOLDERS),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", action="append", default=[], metavar="ID", help="task id (repeatable; default: all)")
    p.add_argument("--kind", action="append", default=[], help=f"task kind (repeatable): {', '.join(tasks.KINDS)}")
    p.add_argument("--tasks-file", type=Path, default=tasks.EVALS_FILE, help="default: evals/evals.json")
    p.add_argument("--agent", help="agent command template (see placeholders below)")
    p.add_argument("--trials", type=int, default=1, help="trials per task (default 1)")
    p.add_argument("--no-skill", action="store_true", help="do not install the skill (the comparison run)")
    p.add_argument("--time-limit", type=float, default=1800.0, help="seconds per trial before the agent is killed")
    p.add_argument("--out", type=Path, help="artifact directory (default: a new temp directory)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved perf rounds when grading (default 3)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="--grade-only: seconds for the whole grading; timing stops at the last whole round that "
                        "fits, and the grade names the rounds left out (a job's time limit then never loses the grade)")
    p.add_argument("--tilegym", type=Path, help="NVIDIA TileGym checkout, for the tilegym-* tasks")
    p.add_argument("--no-reference", action="store_true",
                   help="do not time the reference; use the cited known speedup where there is one")
    p.add_argument("--list", action="store_true", help="list the tasks and exit")
    p.add_argument("--measure-references", action="store_true",
                   help="no agent: time each task's start against its reference (interleaved) and check the "
                        "reference's correctness; fills in 'to be measured' and re-checks cited numbers")
    p.add_argument("--prepare-only", action="store_true",
                   help="build the repo (with the skill unless --no-skill) and write the prompt; print its path")
    p.add_argument("--grade-only", type=Path, nargs="+", metavar="REPO",
                   help="grade an existing task repository; several trials of one task are timed as a group "
                        "(one shared base and reference)")
    p.add_argument("--collect", type=Path, metavar="OUT",
                   help="write OUT/results.json and .md from every graded trial under OUT (agents launched by other means)")
    p.add_argument("--speedups-from-logs", type=Path, metavar="DIR",
                   help="no GPU: per-shape speedups over 'base' of every variant that a grading run's perf logs "
                        "(DIR/round<N>-<variant>.records.jsonl) recorded, e.g. of a grading job cut by its time limit")
    p.add_argument("--base", help="--grade-only: base commit (default: task.json next to the repo, else the root commit)")
    p.add_argument("--ref", default="HEAD", help="--grade-only: the commit graded (default HEAD; main for live runs, "
                   "whose note tells the agent that main is graded)")
    p.add_argument("--json", action="store_true", help="--grade-only: print the whole grade as JSON")
    p.add_argument("--gpu-queue", type=Path, metavar="DIR",
                   help="the agent has no GPU: put a gpu-run command on its PATH that queues jobs in DIR "
                        "(drained with python evals/gpu_queue.py)")
    p.add_argument("--gpu-seconds", type=float, default=600.0,
                   help="--gpu-queue: GPU seconds per trial, the same with and without the skill (default 600)")
    p.add_argument("--show-examples", action="store_true",
                   help="let the agent see the prepared steps of a bundled task's own op (withheld by default)")
    p.add_argument("--note-file", type=Path,
                   help="lines added to the environment part of agent-prompt.txt (rules of the place the agent runs in)")
    return p


def _mode(no_skill: bool) -> str:
    return "noskill" if no_skill else "skill"


def prepare_trial(task: dict, trial_dir: Path, *, skill: bool, suffix: str, tilegym: Path | None,
                  gpu_queue: Path | None = None, gpu_seconds: float = 600.0, note: str = "",
                  show_examples: bool = False) -> dict:
    """Build the repo, install the skill (or not), write the wrapper and the prompt; returns task.json.

    With ``gpu_queue`` the agent works without a GPU and reaches one through ``bin/gpu-run``.
    Every path written for the agent is absolute: the agent runs from inside the repository, where
    a path relative to the runner's directory names nothing (the wrapper's log would be lost).
    """
    trial_dir = trial_dir.resolve()
    trial_dir.mkdir(parents=True, exist_ok=False)
    built = build.build(task, trial_dir / "repo", tilegym=tilegym)
    if skill:
        proc = subprocess.run(shim.cli_argv("install-skill", "--target", str(built.repo)),
                              env=shim.cli_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise build.BuildError(f"install-skill failed: {(proc.stdout + proc.stderr).strip()[-300:]}")
    # The comparison run gets neither the skill nor the CLI: with `cutile-perf` on PATH an agent
    # without the skill found `cutile-perf example show` and copied a prepared step (2026-12-01).
    withhold: tuple[str, ...] = ()
    if skill:
        # A bundled task's prepared steps are its answers (the first live run's agents copied them):
        # the CLI withholds them for the task's own ops unless --show-examples.
        withhold = () if show_examples or tasks.source(task) != "bundled" else tuple(
            Path(f).stem for f in tasks.fence(task) if (build.SUITE / "optimizations" / Path(f).stem).is_dir())
        shim.write_wrapper(trial_dir / "bin", trial_dir / "commands.jsonl", withhold=withhold)
    else:
        (trial_dir / "bin").mkdir(parents=True, exist_ok=True)
    if gpu_queue is not None:
        gpu_queue = gpu_queue.resolve()
        gpuqueue.init_queue(gpu_queue, gpu_seconds)
        gpuqueue.write_client(trial_dir / "bin", gpu_queue, trial_dir)
    python_dir = _python_bin(trial_dir / "python-bin")
    prompt_file = trial_dir / "prompt.txt"
    task_prompt = tasks.prompt(task, suffix)
    prompt_file.write_text(task_prompt, encoding="utf-8")
    skill_md = built.repo / ".claude" / "skills" / "cutile-perf" / "SKILL.md"
    (trial_dir / "agent-prompt.txt").write_text(agent_prompt.agent_prompt(
        task_prompt, repo=built.repo, trial_dir=trial_dir, path_dirs=[trial_dir / "bin", python_dir],
        skill_md=skill_md if skill else None, gpu_seconds=gpu_seconds if gpu_queue is not None else None,
        note=note), encoding="utf-8")
    meta = {"task": task["id"], "mode": _mode(not skill), "base": built.base, "repo": str(built.repo),
            "prompt_file": str(prompt_file), "bin": str(trial_dir / "bin"),
            "commands_log": str(trial_dir / "commands.jsonl"),
            "gpu_queue": str(gpu_queue) if gpu_queue is not None else None,
            "cli": skill,  # the GPU machine's wrapper exists, and withholds, exactly as here
            "withhold_examples": list(withhold),
            "agent_prompt_file": str(trial_dir / "agent-prompt.txt"),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (trial_dir / "task.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


def _python_bin(folder: Path) -> Path:
    """python, python3 and pytest of this interpreter, alone in ``folder``.

    The interpreter's own bin folder would also put this checkout's `cutile-perf` on the agent's
    PATH (an editable install). Scripts, not symlinks: a venv's interpreter finds its packages
    only when started by its own path.
    """
    folder.mkdir()
    for name, args in (("python", ""), ("python3", ""), ("pytest", " -m pytest")):
        (folder / name).write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)}{args} \"$@\"\n", encoding="utf-8")
        (folder / name).chmod(0o755)
    return folder


def _transcript(trial_dir: Path) -> str:
    path = trial_dir / "agent.stdout"
    if not path.is_file():
        return ""
    with path.open("rb") as f:
        return f.read(TRANSCRIPT_CHARS).decode("utf-8", "replace")


def grade_trial(task: dict, repo: Path, *, base: str | None, trial_dir: Path | None, rounds: int,
                tilegym: Path | None, measure_reference: bool) -> grade.Grade:
    return grade_trials(task, [(repo, base, trial_dir)], rounds=rounds, tilegym=tilegym,
                        measure_reference=measure_reference)[0]


def grade_trials(task: dict, trials: list[tuple[Path, str | None, Path | None]], *, rounds: int,
                 tilegym: Path | None, measure_reference: bool, budget_s: float | None = None,
                 ref: str = "HEAD") -> list[grade.Grade]:
    """Grade ``(repo, base, trial_dir)`` trials of one task together (one shared base timing);
    each grade goes to its trial's ``grade.json``."""
    group = [grade.Trial(Path(repo), base, shim.read_calls(d / "commands.jsonl") if d else [],
                         _transcript(d) if d else "", (d / "grade-logs") if d else None, ref)
             for repo, base, d in trials]
    grades = grade.grade_group(group, task, rounds=rounds, tilegym=tilegym, measure_reference=measure_reference,
                               budget_s=budget_s)
    for (_, _, trial_dir), g in zip(trials, grades):
        if trial_dir:
            (trial_dir / "grade.json").write_text(json.dumps(g.to_dict(), indent=2) + "\n", encoding="utf-8")
    return grades


def _write_results(out: Path, results: list[dict]) -> None:
    for name, text in (("results.json", json.dumps(results, indent=2) + "\n"), ("results.md", report.markdown(results))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)


def next_trial(out: Path, task_id: str, mode: str) -> int:
    """The next trial number: a re-run into the same --out adds trials, never overwrites one."""
    done = [int(p.name.rsplit("-", 1)[1]) for p in (out / task_id).glob(f"{mode}-*") if p.name.rsplit("-", 1)[1].isdigit()]
    return max(done, default=0) + 1


def run_all(chosen: list[dict], a: argparse.Namespace, suffix: str) -> int:
    try:
        agent.render(a.agent, {p: "x" for p in agent.PLACEHOLDERS})
    except agent.TemplateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = a.out or Path(tempfile.mkdtemp(prefix="cutile-perf-evals-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"artifacts in {out}", file=sys.stderr)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else []
    mode = _mode(a.no_skill)
    for task in chosen:
        first = next_trial(out, task["id"], mode)
        for n in range(first, first + a.trials):
            trial_dir = out / task["id"] / f"{mode}-{n}"
            print(f"{task['id']} {mode} trial {n}: building", file=sys.stderr)
            meta = prepare_trial(task, trial_dir, skill=not a.no_skill, suffix=suffix, tilegym=a.tilegym,
                                 gpu_queue=a.gpu_queue, gpu_seconds=a.gpu_seconds, note=a.note,
                                 show_examples=a.show_examples)
            print(f"{task['id']} {mode} trial {n}: agent running (limit {a.time_limit:g} s)", file=sys.stderr)
            run = agent.launch(a.agent, repo=Path(meta["repo"]), prompt_file=Path(meta["prompt_file"]),
                               trial_dir=trial_dir, time_limit_s=a.time_limit, bin_dir=Path(meta["bin"]))
            (trial_dir / "agent.json").write_text(json.dumps(asdict(run), indent=2) + "\n", encoding="utf-8")
            print(f"{task['id']} {mode} trial {n}: grading", file=sys.stderr)
            try:
                g = grade_trial(task, Path(meta["repo"]), base=meta["base"], trial_dir=trial_dir, rounds=a.rounds,
                                tilegym=a.tilegym, measure_reference=not a.no_reference)
            except Exception as exc:  # noqa: BLE001 - one trial's broken repo must not end the whole run
                g = grade.Grade(task=task["id"], kind=task["kind"], problems=[f"grading failed: {exc!r}"])
            results.append({"task": task["id"], "mode": mode, "trial": n, "trial_dir": str(trial_dir),
                            "agent": asdict(run), "grade": g.to_dict()})
            _write_results(out, results)
    print(str(out / "results.md"))
    return 0


def speedups_table(runs: measure.Runs) -> str:
    """Markdown: per shape, each variant's median ms and its speedup over ``base``; geomeans last.
    Empty when there is no base run to compare with."""
    if "base" not in runs.by_variant:
        return ""
    others = [v for v in runs.by_variant if v != "base"]
    head = ["shape", "base ms", *[f"{v} ms" for v in others], *[f"{v} speedup" for v in others]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = {v: runs.speedups("base", v) for v in others}
    for shape in runs.shapes():
        ms = [f"{stats.median(runs.by_variant[v][shape]):.4f}" for v in ["base", *others]]
        lines.append("| " + " | ".join([shape, *ms, *[f"{ratios[v][shape]:.3f}" for v in others]]) + " |")
    rounds = {v: min(len(x) for x in runs.by_variant[v].values()) for v in runs.by_variant}
    geomeans = [f"{measure.geomean(ratios[v].values()):.3f}" for v in others]
    lines.append("| " + " | ".join(["geomean", *[""] * (1 + len(others)), *geomeans]) + " |")
    lines.append("")
    lines.append("rounds per variant: " + ", ".join(f"{v} {n}" for v, n in rounds.items()))
    verdicts = [f"{v} {report.slower_verdict(grade.slower_cases(runs.round_speedups('base', v), ratios[v]))}"
                for v in others]
    lines.append(f"no case slower (by more than {grade.SLOWER_TOLERANCE:.0%} in every round): " + "; ".join(verdicts))
    return "\n".join(lines)


def collect_results(out: Path) -> list[dict]:
    """The results of every graded trial under ``out``, rebuilt from its files: for agents launched by
    other means (``--prepare-only``), whose launcher leaves ``agent.json`` next to ``task.json``.
    With a GPU queue, each row also says how many GPU seconds the agent's jobs and the grading took."""
    results = []
    for meta_path in sorted(Path(out).glob("*/*/task.json")):
        trial_dir = meta_path.parent
        if not (trial_dir / "grade.json").is_file():
            continue
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        agent_run = json.loads((trial_dir / "agent.json").read_text()) if (trial_dir / "agent.json").is_file() else {}
        row = {"task": meta["task"], "mode": meta["mode"], "trial": int(trial_dir.name.rsplit("-", 1)[1]),
               "trial_dir": str(trial_dir), "agent": agent_run,
               "grade": json.loads((trial_dir / "grade.json").read_text(encoding="utf-8"))}
        if meta.get("gpu_queue"):
            jobs = gpuqueue.finished_jobs(Path(meta["gpu_queue"]), str(trial_dir.resolve()))
            grading = [j for j in jobs if gpuqueue.is_grading(j)]
            row["gpu"] = {"agent_jobs": len(jobs) - len(grading),
                          "agent_seconds": round(sum(j["seconds"] for j in jobs if j not in grading), 1),
                          # a group's grading job is shared equally by its trials
                          "grading_seconds": round(sum(j["seconds"] / (1 + len(j.get("also") or [])) for j in grading), 1)}
        results.append(row)
    return results


def measure_references(chosen: list[dict], a: argparse.Namespace) -> int:
    """Base vs reference of each measured task, interleaved; ``references.json`` and ``.md`` in --out."""
    out = a.out or Path(tempfile.mkdtemp(prefix="cutile-perf-evals-"))
    rows = []
    for task in [t for t in chosen if tasks.is_measured(t) and tasks.reference(t)]:
        work = out / "references" / task["id"]
        print(f"{task['id']}: building and timing base vs reference", file=sys.stderr)
        built = build.build(task, work / "repo", tilegym=a.tilegym)
        row = {"task": task["id"], "cited": tasks.known_speedup(task).get("value"), "rounds": a.rounds}
        ref_tree = measure.checkout(built.repo, built.base, work / "reference",
                                    overlay=build.reference_files(task, a.tilegym))
        corr = measure.run_correctness(ref_tree, tasks.test_file(task), out_dir=work)
        row["reference_correct"] = corr.passed
        try:
            runs = measure.measure_variants(
                {"base": measure.checkout(built.repo, built.base, work / "base"), "reference": ref_tree},
                tasks.test_file(task), rounds=a.rounds, out_dir=work / "perf", fence=tasks.fence(task))
            row["per_case"] = runs.speedups("base", "reference")
            row["measured"] = measure.geomean(row["per_case"].values())
            row["round_geomeans"] = runs.round_geomeans("base", "reference")
        except measure.MeasureError as exc:
            row["error"] = str(exc)
        rows.append(row)
        (out / "references.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    lines = ["| task | cited | measured (geomean) | per case | reference correct |", "|---|---|---|---|---|"]
    for r in rows:
        cases = ", ".join(f"{k} {v:.3f}x" for k, v in (r.get("per_case") or {}).items()) or r.get("error", "-")
        measured = f"{r['measured']:.3f}" if r.get("measured") else "-"
        lines.append(f"| {r['task']} | {r['cited']} | {measured} | {cases} | {r['reference_correct']} |")
    (out / "references.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(str(out / "references.md"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["grade"]:  # `run.py grade <repo> ...` is `run.py --grade-only <repo> ...`
        if len(argv) < 2:
            print("error: grade needs a repository path", file=sys.stderr)
            return 2
        argv = ["--grade-only", argv[1], *argv[2:]]
    a = _parser().parse_args(argv)
    try:
        a.note = a.note_file.read_text(encoding="utf-8") if a.note_file else ""
    except OSError as exc:
        print(f"error: cannot read --note-file {a.note_file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        data = tasks.load(a.tasks_file)
        all_tasks = data["evals"]
        suffix = data.get("prompt_suffix", "")
        if a.list:
            for t in all_tasks:
                known = tasks.known_speedup(t).get("value", "-")
                print(f"{t['id']:40s} {t['kind']:12s} {tasks.source(t):8s} known speedup: {known}")
            return 0
        if a.grade_only:
            return _grade_only(a, all_tasks)
        if a.speedups_from_logs:
            table = speedups_table(measure.runs_from_logs(a.speedups_from_logs))
            if not table:
                print(f"error: no perf logs with a 'base' run in {a.speedups_from_logs}", file=sys.stderr)
                return 1
            print(table)
            return 0
        if a.collect:
            rows = collect_results(a.collect)
            _write_results(a.collect, rows)
            print(f"{len(rows)} graded trial(s): {a.collect / 'results.md'}")
            return 0 if rows else 1
        chosen = tasks.select(all_tasks, a.task, a.kind)
        if a.prepare_only:
            if len(chosen) != 1:
                print("error: --prepare-only takes exactly one --task", file=sys.stderr)
                return 2
            if a.trials < 1:
                print("error: --trials must be at least 1", file=sys.stderr)
                return 2
            out = a.out or Path(tempfile.mkdtemp(prefix="cutile-perf-evals-"))
            mode = _mode(a.no_skill)
            for _ in range(a.trials):  # numbered after the trials already in --out, so a re-run adds, never replaces
                meta = prepare_trial(chosen[0], out / chosen[0]["id"] / f"{mode}-{next_trial(out, chosen[0]['id'], mode)}",
                                     skill=not a.no_skill, suffix=suffix, tilegym=a.tilegym,
                                     gpu_queue=a.gpu_queue, gpu_seconds=a.gpu_seconds, note=a.note,
                                     show_examples=a.show_examples)
                print(f"repo {meta['repo']}; put {meta['bin']} first on PATH; then grade with: "
                      f"python evals/run.py --grade-only {meta['repo']}", file=sys.stderr)
                print(meta["prompt_file"])
            return 0
        needs = [t["id"] for t in chosen if tasks.source(t) == "tilegym"]
        if needs and not a.tilegym:  # before any trial starts, not an hour into the run
            print(f"error: {', '.join(needs)} need a TileGym checkout: pass --tilegym <path>", file=sys.stderr)
            return 2
        if a.measure_references:
            return measure_references(chosen, a)
        if not a.agent:
            print("error: --agent is required to run tasks (or use --prepare-only / --grade-only / --list)",
                  file=sys.stderr)
            return 2
        if a.trials < 1 or a.rounds < 1:
            print("error: --trials and --rounds must be at least 1", file=sys.stderr)
            return 2
        return run_all(chosen, a, suffix)
    except (tasks.TaskError, build.BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _grade_only(a: argparse.Namespace, all_tasks: list[dict]) -> int:
    """One repository, or several trials of one task graded as a group (one shared base timing)."""
    trials, task_ids = [], set()
    for path in a.grade_only:
        repo = path.resolve()
        meta_path = repo.parent / "task.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        task_id = (a.task or [meta.get("task")])[0]
        if not task_id:
            print(f"error: no --task given and no task.json next to {repo}", file=sys.stderr)
            return 2
        task_ids.add(task_id)
        trials.append((repo, a.base or meta.get("base"), repo.parent if meta else None))
    if len(task_ids) > 1:
        print(f"error: a group must be one task, not {', '.join(sorted(task_ids))}", file=sys.stderr)
        return 2
    task = tasks.by_id(all_tasks, task_ids.pop())
    if a.budget is not None and a.budget <= 0:
        print(f"error: --budget must be positive, not {a.budget:g}", file=sys.stderr)
        return 2
    grades = grade_trials(task, trials, rounds=a.rounds, tilegym=a.tilegym, measure_reference=not a.no_reference,
                          budget_s=a.budget, ref=a.ref)
    for g in grades:
        if a.json:
            print(json.dumps(g.to_dict()))
        else:
            print(json.dumps({k: g.to_dict()[k] for k in ("task", "correctness", "speedup", "reference_speedup",
                                                          "fraction", "score", "success", "hacks", "problems")}))
    return 0 if all(g.success for g in grades) else 1
