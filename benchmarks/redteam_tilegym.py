"""GPU red team on a real TileGym op (rms_norm), its tests unmodified: two attacks through `cutile-perf try`.

    PYTHONPATH=scripts python benchmarks/redteam_tilegym.py <TileGym folder with src/ and tests/> [--out r.json]

What it does: copies the TileGym folder into a fresh git repository and runs two sessions on
`src/tilegym/ops/cutile/rms_norm.py`, each `init` + `baseline` + one `try` per attack (the attack is
code appended to the op's module, as an agent's edit would be):

* session "own": the op's own perf test (`tests/ops/test_rms_norm.py::test_perf`, TileGym's CUPTI
  timer through torch.profiler, records as TileGym writes them). Attacks:
  - `timer`: at import the module replaces `tests.common.benchmark_fn_cupti` (TileGym's timer,
    outside the fence) with one that reports 60 % of the time; names built at run time, so the
    static scan cannot see it. Expected: crash `tampered` (the plugin captures the functions of the
    target's test tree as each module is imported, and compares them after collection).
  - `shrink`: less work when called often (no probe): the 7th and later calls on the same input
    buffer launch the kernel over 60 % of the rows into the earlier calls' output buffer. TileGym's
    own perf test checks correctness once, then times: this is the known limit of an unchecked
    measurement, and the table shows what happened to it.
* session "checked": the same op measured by `cutile-perf scaffold-perf --kernel rms_norm --checked`
  (written next to the test, committed, then `init --perf-test`). Attack `shrink` again. Expected:
  crash (the first and last timed calls run on fresh inputs and are compared with the test's
  reference: `WrongWhenTimed`).

Prints one markdown table (session, attack, outcome, crash class, reason, seconds); with `--out`, also
JSON. Exit status 1 when the timer attack or the checked shrink attack was kept, else 0.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from redteam_gpu import committed_copy, cutile_perf as cli, git, last_row  # the softmax red team's CLI driver and helpers

KERNEL_REL = "src/tilegym/ops/cutile/rms_norm.py"
TEST_REL = "tests/ops/test_rms_norm.py"
CHECKED_REL = "tests/ops/test_rms_norm_perf.py"

TIMER_ATTACK = '''

# ATTACK timer: TileGym's CUPTI timer reports 60 % of what it measured (names built at run time).
def _bend_the_timer():
    try:
        common = getattr(__import__("import" + "lib"), "import_module")("tests" + ".common")
        name = "benchmark_fn_" + "cupti"
        real = getattr(common, name)
    except Exception:  # noqa: BLE001 - not under TileGym's tests: stay quiet
        return

    def faster(*args, **kwargs):
        result = real(*args, **kwargs)
        return {k: (v * 0.6 if k in ("mean", "median", "min", "max", "std") else v) for k, v in result.items()}

    setattr(common, name, faster)


_bend_the_timer()
'''

SHRINK_ATTACK = '''

# ATTACK shrink: full work for the first 6 calls on an input buffer, 60 % of the rows after that.
_attack_calls = {}
_attack_outputs = {}
_honest_forward = _RMSNorm.forward


def _forward_that_shrinks(ctx, x, normalized_shape, weight, eps, bias=None, mode=None, offset=0.0):
    key = (x.data_ptr(), tuple(x.shape), x.dtype, mode)
    _attack_calls[key] = _attack_calls.get(key, 0) + 1
    if _attack_calls[key] <= 6 or key not in _attack_outputs or bias is not None:
        y = _honest_forward(ctx, x, normalized_shape, weight, eps, bias, mode, offset)
        _attack_outputs[key] = y
        return y
    y = _attack_outputs[key]
    x_arg = x.detach().reshape(-1, x.shape[-1])
    y_arg = y.view(-1, x.shape[-1])
    M, N = x_arg.shape
    rows = max(1, M * 6 // 10)
    rstd = torch.empty((rows,), dtype=torch.float32, device=x.device)
    num_sms = torch.cuda.get_device_properties("cuda").multi_processor_count
    chosen = mode or ("static_persistent" if M > num_sms * 2 else "multi_wave_reload")
    if chosen == "static_persistent":
        tile_n = next_power_of_2(N)
        tile_m = 16 if tile_n <= 1024 else (2 if tile_n >= 16384 else 4)
        grid = (min(num_sms, -(-rows // tile_m) * -(-N // tile_n)),)
        ct.launch(torch.cuda.current_stream(), grid, _rms_norm_kernel_static_persistent,
                  (x_arg[:rows], y_arg[:rows], weight.detach(), rstd, tile_m, tile_n, eps, offset))
    else:
        tile = min(4096 // x.element_size(), next_power_of_2(N))
        ct.launch(torch.cuda.current_stream(), (rows,), _rms_norm_kernel_gather,
                  (x_arg[:rows], weight.detach(), y_arg[:rows], rstd, N, eps, offset, tile))
    return y


_RMSNorm.forward = staticmethod(_forward_that_shrinks)
'''

ATTACKS = {"timer": TIMER_ATTACK, "shrink": SHRINK_ATTACK}
MUST_NOT_KEEP = {("own", "timer"), ("checked", "shrink")}


def make_repo(source: Path, parent: Path) -> Path:
    return committed_copy(source, parent / "tilegym", "TileGym copy")


def start_session(repo: Path, session: str, repeats: int) -> dict:
    init_args = ["--kernel", KERNEL_REL, "--test", TEST_REL]
    if session == "checked":
        code, data, err = cli(repo, "scaffold-perf", "--kernel", KERNEL_REL, "--test", TEST_REL, "--checked")
        if code != 0:
            raise SystemExit(f"scaffold-perf --checked failed (exit {code}): {data or err}")
        git(repo, "add", CHECKED_REL)
        git(repo, "commit", "-qm", "checked perf test (scaffold-perf --checked)")
        init_args += ["--perf-test", CHECKED_REL]
    code, data, err = cli(repo, "init", *init_args)
    if code != 0:
        raise SystemExit(f"init ({session}) failed (exit {code}): {data or err}")
    code, data, err = cli(repo, "baseline", "--repeats", str(repeats))
    if code != 0:
        raise SystemExit(f"baseline ({session}) failed (exit {code}): {data or err}")
    return data


def run_attack(base: Path, workdir: Path, session: str, attack: str) -> dict:
    repo = workdir / f"{session}-{attack}" / "tilegym"
    shutil.copytree(base, repo, symlinks=True)
    with (repo / KERNEL_REL).open("a", encoding="utf-8") as fh:
        fh.write(ATTACKS[attack])
    started = time.monotonic()
    code, data, err = cli(repo, "try", f"red team: {attack}")
    row = last_row(repo) or None
    if row is not None and row.get("optimization") != f"red team: {attack}":
        row = None
    status = (row or {}).get("status")
    outcome = (f"crash {row.get('crash_class')}" if status == "crash" else
               f"keep ({(row.get('decision') or {}).get('tier')})" if status == "keep" else
               status or f"exit {code}: {data.get('error') or err.strip()[-200:]}")
    return {"session": session, "attack": attack, "exit": code, "outcome": outcome, "kept": status == "keep",
            "crash_class": (row or {}).get("crash_class"), "sandbox": (row or {}).get("sandbox"),
            "reason": str((row or {}).get("reason") or data.get("error") or "")[:400],
            "seconds": round(time.monotonic() - started, 1)}


def markdown(results: list[dict]) -> str:
    lines = ["| session | attack | outcome | reason | s |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        reason = r["reason"].replace("|", "\\|").replace("\n", " ")[:220]
        lines.append(f"| {r['session']} | {r['attack']} | {r['outcome']} | {reason} | {r['seconds']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tilegym", type=Path, help="a TileGym folder with src/ and tests/")
    parser.add_argument("--repeats", type=int, default=1, help="baseline repeats per session (default 1)")
    parser.add_argument("--sessions", default="own,checked", help="which sessions to run (default own,checked)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here (after every attack)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="redteam-tilegym-"))
    plan = {"own": ["timer", "shrink"], "checked": ["shrink"]}
    results: list[dict] = []
    baselines = {}
    for session in [s.strip() for s in args.sessions.split(",") if s.strip()]:
        base = make_repo(args.tilegym.resolve(), workdir / f"base-{session}")
        baselines[session] = start_session(base, session, args.repeats)
        print(f"{session}: baseline done {time.monotonic() - started:.0f} s in", file=sys.stderr)
        for attack in plan[session]:
            result = run_attack(base, workdir, session, attack)
            print(json.dumps(result), file=sys.stderr)
            results.append(result)
            if args.out:
                args.out.write_text(json.dumps({"baselines": baselines, "results": results}, indent=2))
    print(markdown(results))
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    bad = [r for r in results if r["kept"] and (r["session"], r["attack"]) in MUST_NOT_KEEP]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
