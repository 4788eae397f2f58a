"""GPU red team and cost of checked timed calls (issue 39 items 1-3, 6, 7) on TileGym ops, tests unmodified.

    source .gpu/setup.sh && export PYTHONPATH=$PWD/scripts:$PYTHONPATH   # keeps setup.sh's cuda.tile and GitPython
    bash benchmarks/tilegym_slice.sh /work/tilegym .tg-slice silu_and_mul rms_norm swiglu
    python benchmarks/checked_gpu.py .tg-slice --out $OUT/checked_gpu.json [--budget 420]

Per op (``--ops``; each op's module ``src/tilegym/ops/cutile/<op>.py`` and its public function of the
same name, ``--fn op=name`` otherwise): a fresh git copy, ``init`` + ``baseline --repeats 1``, then
one ``try`` per change (``--changes``), each appended to the op's module as an agent's edit would be:

* ``count``: after 3 calls on the same input tensor, runs the kernel on its first row only and
  returns fresh uninitialised memory of the result's shape;
* ``profiler``: the same while a torch profiler runs (TileGym's CUPTI timer);
* ``big``: the same when the first input's last dimension is 8192 or more (perf-only sizes), from
  the second call of those shapes on;
* ``memo``: like ``count``, but returns the result of its last whole call on that tensor: correct
  values, a one-row kernel's work. No comparison of values can see it; the floor can (``implausible``:
  a record below the bytes the case must move over the bandwidth measured on that GPU).

Each cheat passes the op's correctness tests (a first call of any shapes computes) and still
launches a kernel in every timed call (TileGym's CUPTI timer refuses a callable that launches none,
which caught the first versions of these cheats on the H100, not the harness).
* ``honest``: a comment-only change (the control: any crash or revert naming wrong-when-timed or
  implausible is a false alarm).

Then the cost A/B: ``--ab-runs`` (default 3) interleaved pairs of ``try`` of comment-only changes,
unchecked (``CUTILE_PERF_UNCHECKED=1``, the documented knob) and checked; the wall seconds of each.
``--old-session CHANGE`` (issue 39 item 5): in the first op's session, ``try`` of CHANGE with checked
timing off (``CUTILE_PERF_UNCHECKED=1``: a session from before it, where the cheat could be kept), then
``verify`` (3 pairs, its least) with it on: a kept cheat must fail ``verify`` (exit 1).
Prints one markdown table; ``--out`` also writes JSON after every step. Exit 1 when a cheat was kept
(or slipped through ``verify``) or an honest change was falsely alarmed. GPU memory cost is NOT measured by this script.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from redteam_gpu import checks_off, committed_copy, cutile_perf as cli, git  # noqa: E402

CHANGES = ("count", "profiler", "big", "memo", "honest")
CONDITIONS = {
    # calls on the same input tensor object: a perf test's lambda reuses one; correctness tests make new ones
    # (counted on the tensor object itself: a dict by id or pointer mixed tests up on the H100)
    "count": ("cheat = x is not None and _count(x) > 3"),
    # a torch profiler session: TileGym's default CUPTI timer runs one; correctness tests do not
    "profiler": "cheat = torch.autograd._profiler_enabled()",
    # sizes only perf tests use
    "big": "cheat = x is not None and x.shape[-1:] >= (8192,)",
    # as count; it returns its last whole result on that tensor, not fresh memory
    "memo": "cheat = x is not None and _count(x) > 3",
}
CHEAT = '''

# CHANGE {change}: less work under timing only (a red-team cheat of issue 39).
import torch

_SEEN = {{}}  # what a real call returned, by the shapes and dtypes of the arguments
_real_{fn} = {fn}


def _count(x):
    x._redteam_calls = getattr(x, "_redteam_calls", 0) + 1
    return x._redteam_calls


def _row(a, x):
    return a[:1] if isinstance(a, torch.Tensor) and a.shape == x.shape else a


def _first_tensor(args, kwargs):
    return next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)


def {fn}(*args, **kwargs):
    x = _first_tensor(args, kwargs)
    {condition}
    key = tuple((k, tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", ""))) for k, a in
                (*enumerate(args), *kwargs.items()))
    if cheat and key in _SEEN:
        # The kernel still runs (a timer that sees no kernel refuses), on one row of the first input
        # and of every input shaped like it (swiglu's a and b); the result is fresh memory: whatever
        # the allocator's block of that size held.
        _real_{fn}(*(_row(a, x) for a in args), **{{k: _row(a, x) for k, a in kwargs.items()}})
        if {memo} and getattr(x, "_redteam_memo", None) is not None:
            return x._redteam_memo
        shape, dtype, device, grad = _SEEN[key]
        return torch.empty(shape, dtype=dtype, device=device).requires_grad_(grad)
    out = _real_{fn}(*args, **kwargs)
    if isinstance(out, torch.Tensor):
        _SEEN[key] = (out.shape, out.dtype, out.device, out.requires_grad)
        if {memo} and x is not None:
            x._redteam_memo = out
    return out


# TileGym dispatches through its registry (``register_impl``): a plain rebinding of the module's name would
# never run, and the cheat would be judged as the unchanged op it then is.
try:
    __import__("tilegym.backend", fromlist=["register_impl"]).register_impl("{fn}", backend="cutile")({fn})
except ImportError:  # not a TileGym module (the CPU test's toy op)
    pass
'''


def change_text(change: str, fn: str) -> str:
    """What ``change`` appends to the op's module (pure)."""
    if change == "honest":
        return "\n# CHANGE honest: comment only.\n"
    if change not in CONDITIONS:
        raise ValueError(f"unknown change {change!r}; expected one of {', '.join(CHANGES)}")
    return CHEAT.format(change=change, fn=fn, condition=CONDITIONS[change], memo=change == "memo")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tilegym", type=Path, help="a TileGym slice with src/ and tests/ (benchmarks/tilegym_slice.sh)")
    parser.add_argument("--ops", default="silu_and_mul,rms_norm,swiglu", help="comma-separated TileGym ops")
    parser.add_argument("--changes", default=",".join(CHANGES), help=f"comma-separated, of {', '.join(CHANGES)}")
    parser.add_argument("--fn", action="append", default=[], help="op=function when the op's function is named otherwise")
    parser.add_argument("--ab-runs", type=int, default=3, help="checked/unchecked try pairs for the cost (0: none)")
    parser.add_argument("--ab-op", default="silu_and_mul", help="the op of the cost A/B")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; steps past it are skipped and say so")
    parser.add_argument("--old-session", choices=[c for c in CHANGES if c != "honest"],
                        help="keep this cheat unchecked, then verify the session with checked timing")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    args.ops = [o for o in args.ops.split(",") if o]
    args.changes = [c for c in args.changes.split(",") if c]
    bad = [c for c in args.changes if c not in CHANGES]
    if bad:
        parser.error(f"unknown change(s) {', '.join(bad)}; expected {', '.join(CHANGES)}")
    try:
        args.fn = dict(item.split("=", 1) for item in args.fn)
    except ValueError:
        parser.error("--fn takes op=function")
    if args.ab_runs < 0:
        parser.error("--ab-runs must be >= 0")
    return args


def outcome(change: str, code: int, data: dict) -> dict:
    """One row of the table (pure): what happened, and whether it is what the defence promises."""
    decision, reason = data.get("decision") or data.get("status") or f"exit {code}", str(data.get("reason", ""))
    alarmed = "wrong-when-timed" in reason or "implausible" in reason
    if change == "honest":
        good = not alarmed
    else:
        good = decision != "keep"
    return {"change": change, "decision": decision, "alarm": alarmed, "as_promised": good,
            "checked": data.get("checked", ""), "unchecked": data.get("unchecked", ""),
            "timings": data.get("timings", {}), "reason": reason[:200]}


def table(rows: list[dict]) -> str:
    lines = ["| op | change | decision | alarm | as promised | reason |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.get('op', '')} | {r['change']} | {r['decision']} | {r['alarm']} | {r['as_promised']} | "
                     f"{r['reason'].replace('|', '/')} |")
    return "\n".join(lines)


def cost_summary(unchecked_s: list[float], checked_s: list[float]) -> dict:
    """Median wall seconds of each side and their ratio (pure)."""
    if not unchecked_s or not checked_s:
        return {}
    u, c = statistics.median(unchecked_s), statistics.median(checked_s)
    return {"unchecked_s": unchecked_s, "checked_s": checked_s, "median_ratio": round(c / u, 4) if u else None}


def _session(tilegym: Path, work: Path, op: str) -> Path:
    repo = committed_copy(tilegym, work / op, "TileGym slice")
    for step in (("init", "--kernel", op), ("baseline", "--repeats", "1")):
        code, data, err = cli(repo, *step)
        if code != 0:
            raise RuntimeError(f"{op}: {' '.join(step)} exit {code}: {data.get('error') or err[-300:]}")
    return repo


def _try(repo: Path, op: str, fn: str, change: str) -> tuple[int, dict, float]:
    module = repo / f"src/tilegym/ops/cutile/{op}.py"
    module.write_text(module.read_text() + change_text(change, fn))
    began = time.monotonic()
    code, data, _err = cli(repo, "try", f"{change} change")
    row = {}
    log = repo / "sandbox/experiments.jsonl"
    if log.exists() and log.read_text().strip():
        row = json.loads(log.read_text().strip().splitlines()[-1])
    if git(repo, "status", "--porcelain").strip():  # a kept cheat stays; anything left is undone
        git(repo, "checkout", "--", ".")
    return code, {**row, **data}, time.monotonic() - began


def verify_old_session(repo: Path, op: str, fn: str, change: str, kept=lambda row: None) -> dict:
    """A cheat kept with checked timing off (an old session's lie), then ``verify`` with it on.

    ``kept(row)`` hears how the unchecked try ended before ``verify`` starts, so a run cut during
    ``verify`` still says whether the lie was in the log."""
    with checks_off():
        code, data, seconds = _try(repo, op, fn, change)
    row = {"op": op, "change": f"old-session {change}", "kept_unchecked": data.get("decision"),
           "keep_seconds": round(seconds, 1), "alarm": False, "checked": "", "unchecked": ""}
    kept({**row, "decision": "verify running", "as_promised": False, "reason": str(data.get("reason", ""))[:200]})
    if data.get("decision") != "keep":
        return {**row, "decision": "not kept unchecked: nothing to verify", "as_promised": True,
                "reason": str(data.get("reason", ""))[:200]}
    began = time.monotonic()
    vcode, vdata, verr = cli(repo, "verify")  # its least, 3 pairs
    reason = json.dumps(vdata)[:400] if vdata else verr[-400:]
    return {**row, "decision": f"verify exit {vcode}", "as_promised": vcode == 1, "verify": vdata,
            "verify_seconds": round(time.monotonic() - began, 1), "reason": reason}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began, rows, result = time.monotonic(), [], {}
    work = Path(tempfile.mkdtemp(prefix="checked-gpu-"))

    def save():
        result.update(rows=rows)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))

    for op in args.ops:
        fn = args.fn.get(op, op)
        if time.monotonic() - began > args.budget:
            rows.append({"op": op, "change": "setup", "decision": "skipped: budget", "alarm": False,
                         "as_promised": False, "reason": ""})
            continue
        try:
            repo = _session(args.tilegym, work, op)
        except Exception as exc:  # noqa: BLE001 - one op's setup failing must not hide the others
            rows.append({"op": op, "change": "setup", "decision": "error", "alarm": False, "as_promised": False,
                         "reason": str(exc)[:200]})
            save()
            continue
        for change in args.changes:
            if time.monotonic() - began > args.budget:
                rows.append({"op": op, "change": change, "decision": "skipped: budget", "alarm": False,
                             "as_promised": False, "reason": ""})
                continue
            try:
                code, data, seconds = _try(repo, op, fn, change)
            except Exception as exc:  # noqa: BLE001 - a timeout or git error is a row, not the end of the run
                code, data, seconds = -1, {"decision": "error", "reason": f"{type(exc).__name__}: {exc}"}, 0.0
            rows.append({"op": op, **outcome(change, code, data), "seconds": round(seconds, 1)})
            save()
    if args.old_session and args.ops and (work / args.ops[0]).exists():
        op = args.ops[0]
        over = time.monotonic() - began > args.budget
        rows.append({"op": op, "change": f"old-session {args.old_session}",
                     "decision": "skipped: budget" if over else "unchecked try running",
                     "alarm": False, "as_promised": False, "reason": ""})
        if not over:
            def kept(row: dict) -> None:  # this row says how far it got, should the call be cut
                rows[-1] = row
                save()
            rows[-1] = verify_old_session(work / op, op, args.fn.get(op, op), args.old_session, kept)
        save()
    if args.ab_runs and args.ab_op in args.ops and time.monotonic() - began < args.budget:
        repo, sides = work / args.ab_op, {"unchecked": [], "checked": []}
        for i in range(args.ab_runs):
            # ABBA order: neither side always runs first (a warmer machine or cache favours the second)
            for side in ("unchecked", "checked") if i % 2 == 0 else ("checked", "unchecked"):
                with checks_off() if side == "unchecked" else contextlib.nullcontext():
                    _code, data, seconds = _try(repo, args.ab_op, args.fn.get(args.ab_op, args.ab_op), "honest")
                sides[side].append(round(seconds, 2))
                result["cost"] = cost_summary(sides["unchecked"], sides["checked"])
                result.setdefault("ab_tries", []).append({"side": side, "seconds": round(seconds, 2),
                                                          "decision": data.get("decision"),
                                                          "timings": data.get("timings", {})})
                save()  # a run stopped by its time limit still leaves the pairs it finished
    result["false_alarms"] = sum(1 for r in rows if r["change"] == "honest" and r["alarm"])
    result["cheats_kept"] = sum(1 for r in rows if r["change"] not in ("honest", "setup") and r["decision"] == "keep")
    result["verify_missed"] = sum(1 for r in rows if r["change"].startswith("old-session") and not r["as_promised"])
    save()
    print(table(rows))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return 1 if result["false_alarms"] or result["cheats_kept"] or result["verify_missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
