"""``cutile-perf screen`` on a TileGym op with candidates of known effect (issue 41 item 1), on a GPU.

    source .gpu/setup.sh && export PYTHONPATH=$PWD/scripts:$PYTHONPATH   # keeps setup.sh's cuda.tile and GitPython
    python benchmarks/screen_gpu.py .tg-slice --op silu_and_mul --hints 4 --out $OUT/screen_gpu.json

In a fresh git copy of the TileGym folder: ``init`` + ``baseline --repeats 1``; one plain perf run of
the op by hand (``benchmarks/plain_perf.sh``'s command, run twice: cold and warm compile cache);
then four candidates in ``sandbox/cand/``, each the op's module with a change appended that
re-registers the op's cuTile implementation (TileGym dispatches through ``register_impl``'s
registry, so a plain rebinding of the function would never run):

* ``comment``: a comment only (the same kernel: ratio about 1);
* ``twice``: the op runs its kernel twice and returns the second result (about 2x slower);
* ``sleep``: ``torch.cuda._sleep`` before the kernel (slower by a fixed time per call, where the
  op's timer counts every kernel of the timed call);
* ``wrong``: returns zeros of the right shape (fails correctness: listed, never timed);

and with ``--hints N``, N more of unknown effect (``benchmarks/tilegym_candidates.py``: the op's
kernels with other entry hints), so that ``--hints 4`` screens the eight of issue 41's goal.

Then ``cutile-perf screen 'sandbox/cand/*.py' --seconds N --top 2`` (default 0: one round of every
candidate, however long, which is what issue 41's goal times; with N, the candidates whose first
ranking cannot end in N s are left out) and its wall time against the
plain perf run's. Prints the ranking and one JSON summary; ``--out`` writes it. Exit 1 when the
ranking contradicts the known effects (``expectations``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from redteam_gpu import committed_copy, cutile_perf as cli, git  # noqa: E402
from tilegym_candidates import candidates as hint_candidates  # noqa: E402

CANDIDATES = ("comment", "twice", "sleep", "wrong")
SLEEP_CYCLES = 200_000  # about 0.1 ms at the H100's and H200's ~1.9 GHz: clearly above per-case noise
CHANGE = '''

# SCREEN CANDIDATE {name}: {what}
_screen_real_{fn} = {fn}


@register_impl("{register}", backend="{backend}")
def {fn}(*args, **kwargs):
{body}
'''
BODIES = {
    "twice": ("the kernel runs twice (the same result, twice the work)",
              "    _screen_real_{fn}(*args, **kwargs)\n    return _screen_real_{fn}(*args, **kwargs)"),
    "sleep": (f"a GPU sleep of {SLEEP_CYCLES} cycles before the kernel",
              f"    __import__('torch').cuda._sleep({SLEEP_CYCLES})\n    return _screen_real_{{fn}}(*args, **kwargs)"),
    "wrong": ("zeros instead of the result (a wrong answer)",
              "    return __import__('torch').zeros_like(_screen_real_{fn}(*args, **kwargs))"),
}


def change_text(name: str, fn: str, register: str | None = None, backend: str = "cutile") -> str:
    """What candidate ``name`` appends to the op's module (pure)."""
    if name == "comment":
        return "\n# SCREEN CANDIDATE comment: a comment only, the same kernel.\n"
    what, body = BODIES[name]
    return CHANGE.format(name=name, what=what, fn=fn, register=register or fn, backend=backend,
                         body=body.format(fn=fn))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tilegym", type=Path, help="a TileGym folder with src/ and tests/ (e.g. .tg-slice)")
    p.add_argument("--op", default="silu_and_mul", help="the op (src/tilegym/ops/cutile/<op>.py)")
    p.add_argument("--fn", help="the public function the module registers (default: the op's name)")
    p.add_argument("--seconds", type=float, default=0.0, help="screen --seconds (default 0: one round of all)")
    p.add_argument("--hints", type=int, default=0, help="also this many candidates with other entry hints")
    p.add_argument("--plain-runs", type=int, choices=(0, 1, 2), default=2,
                   help="plain perf runs by hand to price the screen in (default 2: cold, then warm)")
    p.add_argument("--cases", type=int, help="screen --cases N: time every run on N of the base's cases (default: all)")
    p.add_argument("--out", type=Path, help="write the JSON summary here")
    args = p.parse_args(argv)
    if args.seconds < 0 or args.hints < 0:
        p.error("--seconds and --hints must be at least 0")
    args.fn = args.fn or args.op.rpartition("/")[2]
    return args


def expectations(data: dict) -> list[str]:
    """What the screen's JSON contradicts of the known effects (pure); [] when it agrees."""
    problems = []
    ranked = {r["name"]: r for r in data.get("ranked", [])}
    if "comment" not in ranked:
        problems.append("comment-only candidate not ranked")
    elif not 0.9 <= ranked["comment"]["geomean"] <= 1.1:
        problems.append(f"comment-only geomean {ranked['comment']['geomean']:.3f}, expected about 1")
    if "twice" not in ranked:
        problems.append("twice candidate not ranked")
    elif ranked["twice"]["geomean"] < 1.3:
        problems.append(f"twice geomean {ranked['twice']['geomean']:.3f}, expected well above 1")
    if ranked and next(iter(ranked)) != "comment":
        problems.append(f"ranked first: {next(iter(ranked))}, expected comment")
    if (data.get("not_ranked") or {}).get("wrong", {}).get("state") != "fails correctness":
        problems.append(f"wrong candidate: {(data.get('not_ranked') or {}).get('wrong')}, expected fails correctness")
    return problems


def plain_perf_s(repo: Path, op: str, runs: int = 2) -> list[float]:
    """``runs`` plain perf runs of the op, as a user runs them by hand (cold, then warm compile cache)."""
    test = f"tests/ops/{op.rpartition('/')[0] + '/' if '/' in op else ''}test_{op.rpartition('/')[2]}.py"
    env = {**os.environ, "CUDA_TILE_CACHE_DIR": tempfile.mkdtemp(prefix="screen-gpu-jit-"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(repo / "src"), os.environ.get("PYTHONPATH")) if p)}
    seconds = []
    for _ in range(runs):
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "pytest", test, "-k", "test_perf and cutile and not cutile_rs", "-q",
                        "-p", "no:cacheprovider"], cwd=repo, env=env, capture_output=True, timeout=900)
        seconds.append(round(time.monotonic() - began, 1))
    return seconds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="screen-gpu-"))
    # Each CLI command's stderr, line by line with its seconds, and each phase's time as it ends:
    # a GPU call cut off by its limit still says where the time went.
    log = args.out.with_suffix(".log") if args.out else work / "screen_gpu.log"
    began = time.monotonic()

    def phase(what: str) -> None:
        print(f"screen_gpu: {what} at {time.monotonic() - began:.1f} s", flush=True)

    repo = committed_copy(args.tilegym, work / args.op.replace("/", "_"), "TileGym slice")
    for step in (("init", "--kernel", args.op), ("baseline", "--repeats", "1")):
        code, data, err = cli(repo, *step, timeout=1200, log=log)
        if code != 0:
            raise SystemExit(f"{' '.join(step)}: exit {code}: {data.get('error') or err[-300:]}")
        phase(f"{step[0]} done")
    plain = plain_perf_s(repo, args.op, args.plain_runs)
    phase(f"plain perf runs done ({', '.join(f'{s} s' for s in plain) or 'none'}: cold, then warm)")
    module = repo / f"src/tilegym/ops/cutile/{args.op}.py"
    (repo / "sandbox/cand").mkdir(parents=True, exist_ok=True)
    for name in CANDIDATES:
        (repo / f"sandbox/cand/{name}.py").write_text(module.read_text() + change_text(name, args.fn))
    for name, text in (hint_candidates(module.read_text(), args.hints) if args.hints else {}).items():
        (repo / f"sandbox/cand/hint_{name}.py").write_text(text)
    head, rows = git(repo, "rev-parse", "HEAD"), (repo / "sandbox/experiments.jsonl").read_bytes()
    phase(f"screen of {len(list((repo / 'sandbox/cand').glob('*.py')))} candidates starts (log: {log})")
    started = time.monotonic()
    cases = ["--cases", str(args.cases)] if args.cases is not None else []
    code, data, err = cli(repo, "screen", "sandbox/cand/*.py", "--seconds", str(args.seconds), "--top", "2", *cases,
                          timeout=args.seconds + 1800, log=log)
    wall = round(time.monotonic() - started, 1)
    untouched = git(repo, "rev-parse", "HEAD") == head and (repo / "sandbox/experiments.jsonl").read_bytes() == rows \
        and not git(repo, "status", "--porcelain").strip()
    problems = expectations(data) + ([] if untouched else ["the session branch, the log or the tree changed"])
    summary = {"op": args.op, "screen_exit": code, "screen_wall_s": wall, "plain_perf_s": plain,
               "wall_in_plain_runs": round(wall / plain[-1], 2) if plain and plain[-1] else None,
               "seconds": args.seconds,
               "rounds": data.get("rounds"), "phases": data.get("phases"), "cases": data.get("cases"),
               "ranked": data.get("ranked"),
               "not_ranked": data.get("not_ranked"),
               "untouched": untouched, "problems": problems, "stderr_tail": err[-1500:] if code else ""}
    table = repo / "sandbox/screen.md"
    print(table.read_text() if table.exists() else f"no table (exit {code})")
    print(f"screen: {wall} s wall; plain perf runs (cold, then warm): {plain}; "
          f"= {summary['wall_in_plain_runs']} of the last plain run")
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    return 1 if problems or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
