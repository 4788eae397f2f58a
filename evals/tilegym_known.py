"""Measure the known speedup of the TileGym-op eval tasks whose faster version is ours.

    python evals/tilegym_known.py --tilegym <TileGym checkout or slice> --out <dir> [--budget 330] [--rounds 3]
        [--task ID ...] [--reference ID=FILE ...]

For each task (default: every `tilegym-*` task whose reference is a file of this checkout, not
upstream TileGym), on the GPU machine:

1. build the task repository as an agent trial gets it (upstream TileGym, one commit), and two
   clean checkouts of it: `base` (every task's start) and `reference` (every task's faster file
   over it; each op's tests call only that op, so one tree serves all);
2. run TileGym's correctness selection (`measure.CORRECTNESS_K`) of each task on the reference,
   all at once (not timed, so they may share the GPU);
3. time base and reference with TileGym's own perf tests and cutile-perf's record plugin (TileGym's
   CUPTI timer), interleaved: round r runs one pytest process per tree over every task's test
   file, the order rotating each round, as the grader does; a round's processes start together,
   ahead of their turn, and run one at a time (`measure.RoundAhead`).

The whole run is held to `--budget` seconds: a perf run is cut at the budget, and a round in which a
task's cases were not recorded in both trees does not count for that task (each task says how many
rounds it has). A round is not started when the time left is less than the last round took (times
its margin): on the H200 (2026-12-02) one process over all four test files took 78-86 s of wall
time (pytest's own clock: 71-80 s; the 27 perf tests, not start-up, are most of it), so a started
round that cannot end only burns the budget. `--task` times fewer test files per process (the
dropout file alone is 16 of the 27 perf tests; geglu and swiglu together 3).

`--reference ID=FILE` times FILE instead of the task's reference (a candidate kept next to it, e.g.
evals/fixtures/tilegym/dropout/faster2.py): the results name the file and its git blob hash, so
a number always says which file it was measured with. `results.json`, `results.md` and `logs.tar.gz`
(every pytest output and record file) in `--out`; the results hold
per task: correct, per-case median ratio (base / reference), round geomeans, geomean speedup.
Nothing here decides a number by itself: a task with no finished round reports none.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import shutil
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "scripts")]
from cutile_perf.child import records, runner  # noqa: E402
from cutile_perf.judge import stats  # noqa: E402
from cutile_perf_evals import build, measure, tasks  # noqa: E402

# The grader's time-budget rules (measure.MIN_RUN_S, measure.ROUND_MARGIN), per test file here.
MIN_RUN_S, ROUND_MARGIN = measure.MIN_RUN_S, measure.ROUND_MARGIN


def known_tasks(all_tasks: list[dict]) -> list[dict]:
    """TileGym tasks whose reference is a file of this checkout: the speedups we have to measure."""
    return [t for t in all_tasks if tasks.source(t) == "tilegym" and tasks.reference(t)
            and not any(s.startswith("tilegym:") for s in tasks.reference(t).values())]


def blob_hash(path: Path) -> str:
    """Git's blob hash of a file's bytes (what `git hash-object` prints), computed without git."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def reference_overrides(chosen: list[dict], pairs: list[str]) -> dict[str, Path]:
    """``{task id: file}`` from ``--reference ID=FILE`` (each ID one of ``chosen``, FILE readable)."""
    found: dict[str, Path] = {}
    ids = {t["id"] for t in chosen}
    for pair in pairs:
        task_id, sep, file = pair.partition("=")
        if not sep or task_id not in ids or not Path(file).is_file():
            raise ValueError(f"--reference {pair!r}: expected ID=FILE with ID one of the timed tasks "
                             f"({', '.join(sorted(ids))}) and FILE an existing file")
        found[task_id] = Path(file)
    return found


def prepare(chosen: list[dict], tilegym: Path, work: Path,
            overrides: dict[str, Path] | None = None) -> dict[str, Path]:
    """{"base": tree, "reference": tree} under ``work``: the base is upstream TileGym as every one of
    these tasks starts (built as a trial's repository is), the reference the same tree with every
    task's faster file over it. Each op's tests call only that op, so one tree serves all of them and
    one pytest process per variant and round times every op: 6 processes for 3 rounds instead of 24.
    ``overrides``: ``{task id: file}`` put over that task's fenced file instead of its reference."""
    shutil.rmtree(work, ignore_errors=True)
    built = build.build(chosen[0], work / "repo", tilegym=tilegym)
    overlay: dict[str, bytes] = {}
    for task in chosen:
        setup = task.get("setup") or {}
        if setup.get("degrade") or setup.get("start") or setup.get("session"):
            raise build.BuildError(f"{task['id']} does not start from upstream TileGym")
        if overrides and task["id"] in overrides:
            (fenced,) = tasks.fence(task)
            overlay[fenced] = overrides[task["id"]].read_bytes()
        else:
            overlay.update(build.reference_files(task, tilegym))
    return {"base": measure.checkout(built.repo, built.base, work / "base"),
            "reference": measure.checkout(built.repo, built.base, work / "reference", overlay=overlay)}


def perf_argv(tests_: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *tests_, "-k", measure.PERF_K, "-q", "-p", "no:cacheprovider",
            *records.PYTEST_PLUGIN_ARGS]


def perf_run(tree: Path, tests_: list[str], *, tag: str, out_dir: Path, timeout_s: float,
             start: runner.StartGate | None = None, on_start=None) -> dict[str, dict[str, float]]:
    """One pytest process over ``tests_`` (TileGym's perf selection, cutile-perf's record plugin):
    ``{test file: {case: median ms}}``. A failing or cut run still gives what it recorded; a test
    file with no record is simply absent (its task then has no pair for this round). ``start``:
    started ahead of its turn (``measure.RoundAhead``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records_file = out_dir / f"{tag}.records.jsonl"
    records_file.unlink(missing_ok=True)
    env = {**measure._env(tree), "CUTILE_PERF_RECORDS": str(records_file)}
    runner.run(perf_argv(tests_), cwd=tree, timeout_s=timeout_s, output_path=out_dir / f"{tag}.log", env_overrides=env,
               start=start, on_start=on_start)
    found = records.read_records_file(records_file)
    by_file: dict[str, dict[str, float]] = {}
    for test in tests_:
        mine = [r for r in found if r.test_id.split("::")[0] == test]
        if mine:
            by_file[test] = measure.case_medians(mine)
    return by_file


def time_rounds(trees: dict[str, Path], tests_: list[str], *, rounds: int, deadline: float,
                out_dir: Path, walls: list[dict] | None = None,
                ahead: bool = True) -> tuple[dict[str, measure.Runs], dict[str, int], list[str]]:
    """Interleaved rounds (order rotating) until ``rounds`` or ``deadline``. Per test file: its Runs
    and how many rounds paired a base and a reference run of it; an unpaired run is dropped, never
    half-counted. Also the notes of rounds cut or not run. A round after the first starts only when
    ``ROUND_MARGIN`` times the last round's wall time is left. ``walls`` (when given) gets one
    ``{"tag", "wall_s", "files"}`` per perf process: what the next budget is planned from.
    ``ahead``: each round's processes start together, ahead of their turn (``measure.RoundAhead``)."""
    names = list(trees)
    runs = {t: measure.Runs({name: {} for name in names}) for t in tests_}
    paired = {t: 0 for t in tests_}
    notes: list[str] = []
    last_round_s = 0.0
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        got: dict[str, dict[str, dict[str, float]]] = {}
        round_start = time.monotonic()
        if r and deadline - round_start < ROUND_MARGIN * last_round_s:
            notes.append(f"round {r + 1}: not started, {deadline - round_start:.0f} s left and the last round "
                         f"took {last_round_s:.0f} s")
            break
        # The round's runs start together, ahead of their turn, as the grader's do (measure.RoundAhead).
        started = measure.RoundAhead({name: functools.partial(perf_run, trees[name], tests_, tag=f"round{r + 1}-{name}",
                                                              out_dir=out_dir) for name in order} if ahead else {},
                                     perf_argv(tests_))
        try:
            for name in order:
                start = time.monotonic()
                left = deadline - start
                if left < MIN_RUN_S:
                    notes.append(f"round {r + 1}: out of time before {name} ({left:.0f} s left)")
                    break
                if started.has(name):
                    try:
                        got[name] = started.run(name, left)
                    except measure.MeasureError:  # killed at the budget's end: what it recorded is lost
                        got[name] = {}
                else:
                    got[name] = perf_run(trees[name], tests_, tag=f"round{r + 1}-{name}", out_dir=out_dir,
                                         timeout_s=left)
                if walls is not None:
                    walls.append({"tag": f"round{r + 1}-{name}", "wall_s": round(time.monotonic() - start, 1),
                                  "files": len(got[name])})
        finally:
            started.cancel()
        last_round_s = time.monotonic() - round_start
        for test in tests_:
            if all(test in got.get(name, {}) for name in names) \
                    and len({frozenset(got[name][test]) for name in names}) == 1:
                for name in names:
                    for case, ms in got[name][test].items():
                        runs[test].by_variant[name].setdefault(case, []).append(ms)
                paired[test] += 1
        if len(got) < len(names):
            break
    return runs, paired, notes


def summarize(runs: measure.Runs, rounds_done: int) -> dict:
    row: dict = {"rounds_done": rounds_done}
    if rounds_done:
        row["per_case"] = runs.speedups("base", "reference")
        row["base_ms"] = {c: stats.median(v) for c, v in runs.by_variant["base"].items()}
        row["reference_ms"] = {c: stats.median(v) for c, v in runs.by_variant["reference"].items()}
        row["round_geomeans"] = runs.round_geomeans("base", "reference")
        row["geomean"] = measure.geomean(row["per_case"].values())
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| task | reference (git blob) | correct | rounds | geomean speedup | round geomeans | per case (base/reference) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        geo = f"{r['geomean']:.3f}" if r.get("geomean") and not math.isnan(r["geomean"]) else "-"
        rounds = ", ".join(f"{g:.3f}" for g in r.get("round_geomeans") or []) or "-"
        cases = ", ".join(f"{c} {v:.3f}" for c, v in (r.get("per_case") or {}).items()) or "; ".join(r.get("errors") or ["-"])
        ref = f"{Path(r['reference_file']).name} ({r['reference_blob'][:12]})" if r.get("reference_file") else "-"
        lines.append(f"| {r['task']} | {ref} | {r['correct']} | {r.get('rounds_done', 0)} | {geo} | {rounds} | {cases} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python evals/tilegym_known.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tilegym", type=Path, required=True, help="TileGym checkout (src/ and tests/ at least)")
    p.add_argument("--out", type=Path, required=True, help="results.json, results.md and the logs go here")
    p.add_argument("--task", action="append", default=[], help="task id (repeatable; default: all known_tasks)")
    p.add_argument("--reference", action="append", default=[], metavar="ID=FILE",
                   help="time FILE as task ID's reference instead of its own (repeatable), e.g. "
                        "tilegym-dropout=evals/fixtures/tilegym/dropout/faster2.py")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget", type=float, default=330.0, help="seconds for the whole run (default 330)")
    p.add_argument("--correctness-timeout", type=float, default=150.0)
    a = p.parse_args(argv)
    start = time.monotonic()
    all_tasks = tasks.load_tasks()
    chosen = [tasks.by_id(all_tasks, i) for i in a.task] if a.task else known_tasks(all_tasks)
    if not chosen:
        print("error: no task to measure", file=sys.stderr)
        return 2
    try:
        overrides = reference_overrides(chosen, a.reference)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.out / "work"
    trees = prepare(chosen, a.tilegym.resolve(), work, overrides)
    print(f"built the base and reference trees in {time.monotonic() - start:.0f} s", flush=True)

    # Correctness of the reference is not timed: every task's selection at once, each its own process.
    def correct(task: dict) -> measure.Correctness:
        log_dir = a.out / "logs" / task["id"]
        log_dir.mkdir(parents=True, exist_ok=True)
        return measure.run_correctness(trees["reference"], tasks.test_file(task),
                                       timeout_s=a.correctness_timeout, out_dir=log_dir)
    with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
        verdicts = dict(zip([t["id"] for t in chosen], pool.map(correct, chosen)))
    print(f"correctness done at {time.monotonic() - start:.0f} s: "
          + ", ".join(f"{k} {'PASS' if v.passed else 'FAIL (' + str(v.crash_class) + ')'}" for k, v in verdicts.items()),
          flush=True)

    # A reference that failed its tests is still timed (the table says it failed): its tests ran
    # alone in their process, so a crash there cannot take the other ops' correctness with it.
    tests_ = [tasks.test_file(t) for t in chosen]
    t0 = time.monotonic()
    walls: list[dict] = []
    runs, paired, notes = time_rounds(trees, tests_, rounds=a.rounds, deadline=start + a.budget,
                                      out_dir=a.out / "logs" / "perf", walls=walls)
    rows = []
    for task in chosen:
        test = tasks.test_file(task)
        v = verdicts[task["id"]]
        ref_file = overrides.get(task["id"]) or build.resolve_source(next(iter(tasks.reference(task).values())), a.tilegym.resolve())
        row = {"task": task["id"], "test": test, "correct": v.passed, "correctness_crash": v.crash_class,
               "reference_file": str(ref_file), "reference_blob": blob_hash(ref_file),
               **summarize(runs[test], paired[test]), "errors": list(notes), "processes": walls}
        if not paired[test]:
            row["errors"].append(f"no round recorded {test} in both trees; see logs/perf/")
        rows.append(row)
    print(f"timing: {time.monotonic() - t0:.0f} s, rounds per task: "
          + ", ".join(f"{r['task']} {r['rounds_done']}" for r in rows), flush=True)
    (a.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)  # the trees are rebuilt from the checkout; keep only logs
    # One archive for the logs: the GPU lending tool brings back at most 8 files per call.
    with tarfile.open(a.out / "logs.tar.gz", "w:gz") as tar:
        tar.add(a.out / "logs", arcname="logs")
    shutil.rmtree(a.out / "logs")
    (a.out / "results.md").write_text(markdown(rows), encoding="utf-8")
    print(markdown(rows))
    print("perf processes: " + ", ".join(f"{w['tag']} {w['wall_s']:.0f} s" for w in walls))
    print(f"total {time.monotonic() - start:.0f} s")
    return 0 if all(r["correct"] and r.get("geomean") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
