"""A campaign over a TileGym checkout (issue 41 item 4): survey its ops, then for each op with prepared
candidates screen them and decide the best with ``batch``, one op per GPU of the node; one table.

    source .gpu/setup.sh && export PYTHONPATH=$PWD/scripts:$PYTHONPATH
    python benchmarks/tilegym_campaign.py TILEGYM CANDS --out OUT [--gpus all] [--engine local|ray]
        [--screen-seconds 240] [--top 2] [--job-seconds 540] [--timeout 300]

``CANDS/<op>/*.py``: candidate files for ``src/tilegym/ops/cutile/<op>.py`` (each a whole module, as
``screen`` takes them). Steps:

1. ``cutile-perf survey`` on a fresh git copy of TILEGYM: which ops the loop can drive (``--run``
   with ``--survey-run``: each selection run once);
2. per op that is drivable and has candidates, a task on one worker (``cutile_perf.node``: one worker
   per GPU, ``CUDA_VISIBLE_DEVICES`` its GPU alone; the Ray engine spreads over hosts): a fresh git
   copy, ``init --kernel <op>``, ``baseline``, ``screen 'sandbox/cand/*.py' --top K``, then
   ``batch sandbox/screen-plan.yaml``, which decides the top K as ``try`` does (every check);
3. one table from each op's log (``op_row``): the baseline's geomean time, the best kept change
   (the row the session now compares with), its speedup over the baseline (geomean over cases),
   its % of the copy roofline where known, how many candidates were screened and decided. The copy
   roofline of a case is the time its tensors take to move once at the copy bandwidth measured on
   that GPU (a row's ``copy_floor_ms``, from checked timed calls: the same for every candidate of
   the case); the column is its geomean ratio to the best row's medians over the cases that have
   one, a bound that only memory-bound ops come near ("-" where no row of the op had one).

Writes ``OUT/campaign.md`` and ``OUT/campaign.json`` (and each op's log and tables under ``OUT/<op>/``).
``--no-gpu`` sets ``require_gpu: false`` after ``init``: only for the CPU test's SIMULATED repository.
Exit 1 when an op's task failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from redteam_gpu import committed_copy, cutile_perf as cli  # noqa: E402

from cutile_perf import knobs, node  # noqa: E402
from cutile_perf.judge import stats  # noqa: E402
from cutile_perf.judge.rules import current_baseline  # noqa: E402
from cutile_perf.store.log import shape_medians  # noqa: E402

COLUMNS = ("op", "base geomean (ms)", "best verified", "speedup", "% of copy roofline", "screened", "decided",
           "note")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tilegym", type=Path, help="TileGym folder (src/ and tests/)")
    p.add_argument("cands", type=Path, help="folder of <op>/*.py candidate files")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gpus", default="all", help="workers: N or all (default all; one CPU worker without a GPU)")
    p.add_argument("--engine", choices=node.ENGINES, default="local")
    p.add_argument("--screen-seconds", type=float, default=240.0)
    p.add_argument("--top", type=int, default=2)
    p.add_argument("--job-seconds", type=float, default=540.0, help="batch's --job-seconds per op")
    p.add_argument("--timeout", type=float, default=300.0, help="init's --timeout: seconds per iteration")
    p.add_argument("--repeats", type=int, default=1, help="baseline --repeats")
    p.add_argument("--survey-run", action="store_true", help="survey --run: each op's selections run once first")
    p.add_argument("--no-gpu", action="store_true", help="require_gpu: false (the CPU test's simulated repo only)")
    args = p.parse_args(argv)
    if args.top < 1 or args.screen_seconds < 0 or args.job_seconds <= 0:
        p.error("--top must be >= 1, --screen-seconds >= 0 and --job-seconds > 0")
    return args


def plan_ops(survey_ops: list[dict], cands: Path) -> tuple[list[str], dict[str, str]]:
    """(ops to run, op -> why not) from ``survey --json``'s ops and the candidate folders (pure but
    for listing ``cands``)."""
    drivable = {o["op"]: o for o in survey_ops}
    run, skipped = [], {}
    for folder in sorted(p for p in cands.iterdir() if p.is_dir()):
        op = folder.name
        if not any(folder.glob("*.py")):
            skipped[op] = "no candidate files"
        elif op not in drivable:
            skipped[op] = "not an op of this repository"
        elif not drivable[op]["drivable"]:
            skipped[op] = "not drivable: " + (drivable[op].get("problem") or drivable[op].get("needs_cuda") or
                                              "a selection is empty or a run failed")
        else:
            run.append(op)
    return run, skipped


def op_row(op: str, rows: list[dict], screened: int) -> dict:
    """One line of the table from an op's log rows (pure)."""
    base = rows[0] if rows else None
    current = current_baseline(rows)
    if base is None or current is None:
        return {"op": op, "note": "no baseline"}
    first, now = shape_medians(base), shape_medians(current)
    cases = sorted(set(first) & set(now))
    geomean = stats.geomean([first[c] for c in cases]) if cases else None
    speedup = stats.geomean([first[c] / now[c] for c in cases]) if cases else None
    decided = [r for r in rows if r.get("iteration", 0) > 0 and r.get("status") in ("keep", "revert")]
    best = current.get("optimization") if current is not base else None
    return {"op": op, "base_geomean_ms": geomean, "best": best, "speedup": speedup if best else 1.0,
            "roofline": roofline_share(rows, now), "screened": screened, "decided": len(decided), "note": ""}


def roofline_share(rows: list[dict], medians: dict) -> float | None:
    """Geomean of (copy floor / median) over the cases a row of the log gave a floor (the last such
    row's), or None (pure)."""
    floors = next((r["copy_floor_ms"] for r in reversed(rows) if r.get("copy_floor_ms")), {})
    shares = [floors[c] / medians[c] for c in sorted(floors) if medians.get(c)]
    return stats.geomean(shares) if shares else None


def render(lines: list[dict], skipped: dict[str, str]) -> str:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in lines:
        base = f"{r['base_geomean_ms']:.4f}" if r.get("base_geomean_ms") else "-"
        speed = f"{r['speedup']:.3f}x" if r.get("speedup") else "-"
        roof = f"{100 * r['roofline']:.0f} %" if r.get("roofline") else "-"
        out.append(f"| {r['op']} | {base} | {r.get('best') or 'none (baseline kept)'} | {speed} | {roof} | "
                   f"{r.get('screened', '-')} | {r.get('decided', '-')} | {r.get('note', '')} |")
    out += [f"| {op} | - | - | - | - | - | - | skipped: {why} |" for op, why in sorted(skipped.items())]
    return "\n".join(out)


def _step(repo: Path, out: Path, name: str, *args: str, timeout: float) -> dict:
    """One command in the op's copy; its exit, JSON and stderr tail saved as ``OUT/<op>/<name>.json``."""
    code, data, err = cli(repo, *args, timeout=timeout, log=out / "commands.log")  # stderr as it comes
    (out / f"{name}.json").write_text(json.dumps({"exit": code, "data": data, "stderr": err}, indent=1))
    if code not in (0, 1):  # 1: a check said no (a revert is still a decided try)
        raise RuntimeError(f"{repo.name}: {name} exited {code}: {data.get('error') or err[-300:]}")
    return data


def op_task(payload: dict) -> dict:
    """One op's session, start to end, in a fresh copy (a task function of ``cutile_perf.node``)."""
    out = Path(payload["out"]) / payload["op"]
    out.mkdir(parents=True, exist_ok=True)
    repo = committed_copy(Path(payload["tilegym"]), Path(tempfile.mkdtemp()) / payload["op"], "TileGym copy")
    long = payload["timeout"] * 20
    _step(repo, out, "init", "init", "--kernel", payload["op"], "--timeout", str(payload["timeout"]), timeout=long)
    if payload["no_gpu"]:
        session = repo / "sandbox/session.yaml"
        session.write_text(session.read_text().replace("require_gpu: true", "require_gpu: false"))
    _step(repo, out, "baseline", "baseline", "--repeats", str(payload["repeats"]), timeout=long)
    cand = repo / "sandbox/cand"
    cand.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(payload["cands"]).glob("*.py")):
        shutil.copyfile(f, cand / f.name)
    screen = _step(repo, out, "screen", "screen", "sandbox/cand/*.py", "--seconds", str(payload["screen_seconds"]),
                   "--top", str(payload["top"]), timeout=long + payload["screen_seconds"])
    ranked = screen.get("ranked") or []
    if ranked and (repo / "sandbox/screen-plan.yaml").exists():
        _step(repo, out, "batch", "batch", "sandbox/screen-plan.yaml", "--job-seconds", str(payload["job_seconds"]),
              timeout=payload["job_seconds"] + 120)
    log = repo / "sandbox/experiments.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    for name in ("experiments.jsonl", "perf_results.md", "screen.md"):
        if (repo / "sandbox" / name).exists():
            shutil.copyfile(repo / "sandbox" / name, out / name)
    return op_row(payload["op"], rows, len(ranked))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    look = committed_copy(args.tilegym, Path(tempfile.mkdtemp()) / "tilegym", "TileGym copy")
    _code, survey, _err = cli(look, "survey", *(["--run"] if args.survey_run else []), timeout=3600)
    (args.out / "survey.json").write_text(json.dumps(survey, indent=1))
    ops, skipped = plan_ops(survey.get("ops", []), args.cands)
    tasks = {op: {"op": op, "tilegym": str(args.tilegym.resolve()), "cands": str((args.cands / op).resolve()),
                  "out": str(args.out.resolve()), "timeout": args.timeout, "repeats": args.repeats,
                  "screen_seconds": args.screen_seconds, "top": args.top, "job_seconds": args.job_seconds,
                  "no_gpu": args.no_gpu} for op in ops}
    results = node.run_tasks(engine=args.engine, spec="tilegym_campaign:op_task", tasks=tasks, wanted=args.gpus,
                             root=args.out / "tasks", visible=knobs.visible_devices()) if tasks else {}
    lines, failed = [], 0
    for op in ops:
        result = results.get(op, {"status": "lost"})
        if result.get("status") == "ok":
            lines.append(result["result"])
        else:
            failed += 1
            lines.append({"op": op, "note": f"{result.get('status')}: {result.get('error', '')}"[:200]})
    table = render(lines, skipped)
    (args.out / "campaign.md").write_text(table + "\n")
    (args.out / "campaign.json").write_text(json.dumps({"ops": lines, "skipped": skipped}, indent=1))
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
