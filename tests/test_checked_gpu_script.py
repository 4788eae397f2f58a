"""The CPU-runnable parts of benchmarks/checked_gpu.py, so its one GPU call does not fail on a typo."""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("checked_gpu", BENCH / "checked_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_and_bad_arguments(script, capsys):
    args = script.parse_args(["slice"])
    assert args.ops == ["silu_and_mul", "rms_norm", "swiglu"] and args.changes == list(script.CHANGES)
    assert args.ab_runs == 3 and args.fn == {}
    assert script.parse_args(["s", "--fn", "swiglu=swiglu_fwd"]).fn == {"swiglu": "swiglu_fwd"}
    for bad in (["s", "--changes", "count,nope"], ["s", "--fn", "noequals"], ["s", "--ab-runs", "-1"]):
        with pytest.raises(SystemExit) as exc:
            script.parse_args(bad)
        assert exc.value.code == 2


@pytest.mark.parametrize("change", ["count", "profiler", "big", "memo", "honest"])
def test_each_cheat_passes_correctness_and_does_less_work_only_when_timed(script, change):
    """A cheat that failed the op's correctness tests, or launched no kernel in a timed call, was caught
    on the H100 by those, not by checked timing: each must look honest until it is timed."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    # two inputs of one shape, as swiglu's (a, b): the cheat's one-row call must keep them alike
    source = ("import torch\nROWS = []\n\ndef op(x, y=None, scale=2):\n    ROWS.append(x.shape[0])\n"
              "    assert y is None or y.shape == x.shape, 'inputs of one shape'\n"
              "    return x * scale\n" + script.change_text(change, "op"))
    namespace: dict = {}
    exec(compile(source, "op.py", "exec"), namespace)  # noqa: S102 - the script's own generated code
    op, rows = namespace["op"], namespace["ROWS"]
    for n in (4, 8192, 4):  # correctness tests: a new tensor each, called once or twice
        x = torch.ones(3, n)
        assert torch.equal(op(x), x * 2) and torch.equal(op(x, scale=2), x * 2)
    assert rows == [3] * 6  # every call did the whole work
    rows.clear()
    x = torch.ones(5, 16384)  # a perf test: new shapes, one tensor, many calls, under a profiler (CUPTI)
    with profile(activities=[ProfilerActivity.CPU]):
        results = [op(x) for _ in range(6)] + [op(x, torch.ones(5, 16384)) for _ in range(4)]
    assert all(r.shape == (5, 16384) for r in results)
    if change == "honest":
        assert rows == [5] * 10
    else:  # the cheat ran the op on one row only, from some call on: less work, still a launch
        assert 1 in rows and rows[0] == 5, rows
    if change == "memo":  # and returned the right values, those of its last whole call
        assert all(torch.equal(r, x * 2) for r in results[:6]) and results[5] is results[3]


def test_outcome_table_and_cost(script):
    cheat = script.outcome("count", 1, {"decision": "revert", "reason": "perf wrong-when-timed: case 64x16384, call 7"})
    assert cheat["as_promised"] and cheat["alarm"]
    assert not script.outcome("big", 0, {"decision": "keep"})["as_promised"]
    alarm = script.outcome("honest", 1, {"decision": "revert", "reason": "perf implausible: case x"})
    assert alarm["alarm"] and not alarm["as_promised"]
    text = script.table([{"op": "rms_norm", **cheat}])
    assert text.count("\n") == 2 and "rms_norm" in text
    cost = script.cost_summary([10.0, 12.0, 11.0], [11.0, 13.0, 12.1])
    assert cost["median_ratio"] == pytest.approx(12.1 / 11.0, rel=1e-3)
    assert script.cost_summary([], [1.0]) == {}


@pytest.fixture
def controls():
    spec = importlib.util.spec_from_file_location("honest_controls", BENCH / "honest_controls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_honest_controls_count_alarms_on_try_rows_only(controls):
    """benchmarks/honest_controls.py's reading of a demo's log (its GPU run gives the counts)."""
    module = controls
    assert {"rms_norm", "softmax"} <= set(module.prepared_kernels())
    rows = [{"iteration": 0, "status": "keep", "reason": "baseline (no code change)"},
            {"iteration": 1, "optimization": "tile 8", "status": "revert", "reason": "slower: +4 % vs gate 1 %"},
            {"iteration": 2, "optimization": "tma", "status": "revert", "crash_class": "wrong-when-timed",
             "reason": "perf wrong-when-timed: case 1"},
            {"iteration": 3, "optimization": "x", "status": "revert", "reason": "implausible: below the floor"},
            {"iteration": 4, "optimization": "y", "status": "crash", "crash_class": "tampered", "reason": "replaced"}]
    lines = module.step_lines("rms_norm", rows)
    assert [line["false_alarm"] for line in lines] == ["", "wrong-when-timed", "implausible", "tampered"]
    assert lines[0] == {"kernel": "rms_norm", "step": "tile 8", "decision": "revert", "checked": None,
                        "false_alarm": "", "reason": "slower: +4 % vs gate 1 %"}


def test_old_session_names_a_cheat(script):
    assert script.parse_args(["s"]).old_session is None
    assert script.parse_args(["s", "--old-session", "count"]).old_session == "count"
    assert script.parse_args(["s", "--changes", "", "--old-session", "count"]).changes == []  # gpu_s41's oldverify
    for bad in ("honest", "nope"):  # only a cheat can slip into an old session
        with pytest.raises(SystemExit) as exc:
            script.parse_args(["s", "--old-session", bad])
        assert exc.value.code == 2


def test_old_session_says_whether_the_lie_was_kept_before_verify_runs(script, monkeypatch):
    # A GPU call cut during `verify` (session 41: 330 s were not enough) must still leave the first
    # half's outcome: was the cheat kept while checked timing was off?
    heard = []
    monkeypatch.setattr(script, "_try", lambda repo, op, fn, change: (0, {"decision": "keep", "reason": "faster"}, 4.0))

    def verify_after_the_report(repo, *args):
        assert heard and heard[0]["kept_unchecked"] == "keep" and heard[0]["decision"] == "verify running"
        return 1, {"exit": 1}, ""
    monkeypatch.setattr(script, "cli", verify_after_the_report)
    row = script.verify_old_session(Path("repo"), "silu_and_mul", "silu_and_mul", "count", heard.append)
    assert row["decision"] == "verify exit 1" and row["as_promised"] is True and len(heard) == 1


def test_honest_controls_end_a_demo_past_its_time_and_keep_its_rows(controls, tmp_path, monkeypatch):
    # A simulated demo (not the loop): it logs one try, then hangs until SIGTERM, which it answers
    # as the loop does (logs the interrupted try, exits 130).
    monkeypatch.setattr(controls, "DEMO_CODE", """
import json, signal, sys, time
from pathlib import Path
log = Path(sys.argv[2]) / "sandbox" / "experiments.jsonl"
log.parent.mkdir(parents=True)
def row(i, status, reason):
    with log.open("a") as f:
        f.write(json.dumps({"iteration": i, "optimization": f"step {i}", "status": status, "reason": reason}) + "\\n")
row(0, "keep", "baseline"); row(1, "keep", "faster")
signal.signal(signal.SIGTERM, lambda *a: (row(2, "crash", "interrupted"), sys.exit(130)))
print("demo started", flush=True)
time.sleep(60)
""")
    began = time.monotonic()
    code, rows = controls.run_demo("rms_norm", tmp_path / "demo", 2.0, tmp_path)
    assert code == "timeout" and time.monotonic() - began < 30
    assert [r["status"] for r in rows] == ["keep", "keep", "crash"]
    assert "demo started" in (tmp_path / "rms_norm-demo.txt").read_text()


def test_honest_controls_run_demos_side_by_side_and_count_alarms(controls, tmp_path, monkeypatch, capsys):
    running, most = [0], [0]

    def fake_demo(kernel, dest, timeout, out):
        running[0] += 1
        most[0] = max(most[0], running[0])
        time.sleep(0.3)
        running[0] -= 1
        alarm = {"crash_class": "wrong-when-timed"} if kernel == "softmax" else {}
        return 0, [{"iteration": 0, "status": "keep"},
                   {"iteration": 1, "optimization": "s", "status": "revert", "reason": "r", **alarm}]
    monkeypatch.setattr(controls, "run_demo", fake_demo)
    code = controls.main(["--kernels", "rms_norm,softmax,swiglu", "--parallel", "3", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert code == 1 and most[0] == 3
    assert summary["tries"] == 3 and summary["false_alarms"] == 1 and summary["unfinished"] == []
    assert (tmp_path / "softmax-experiments.jsonl").read_text().count("\n") == 2
    with pytest.raises(SystemExit):
        controls.main(["--parallel", "0", "--out", str(tmp_path)])
