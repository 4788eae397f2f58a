"""benchmarks/log_rows.py's reading of child logs, on lines copied from session 24's H200 logs."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("log_rows", _BENCH / "log_rows.py")
log_rows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(log_rows)

AHEAD_LOG = """\
$ /opt/torch/.venv/bin/python -m pytest tests/ops/test_rms_norm.py -k test_ and cutile -q (in the sandbox) (started ahead of its turn)
cutile-perf: preloaded 6 installed module(s) the baseline's tests imported (3.03 s): execnet, mpmath, sympy
cutile-perf: profiler set up while waiting (2.91 s, no CUDA context)
cutile-perf: let go after 0.01 s at the gate (ready 9.87 s after it began importing)
......sssss                                                              [100%]
6 passed, 5 skipped, 4 deselected in 5.69s
"""
FRESH_LOG = """\
$ /opt/torch/.venv/bin/python -m pytest tests/ops/test_rms_norm.py -q (in the sandbox)
FF                                                                       [100%]
1 failed, 1 passed in 12.50s
"""


def test_a_child_log_gives_its_session_preloads_and_wait_at_the_gate():
    assert log_rows.child_log_facts(AHEAD_LOG) == {"ahead": True, "collected": False, "session_s": 5.69, "preloads": 6,
                                                   "preload_s": 3.03, "waited_s": 0.01, "ready_s": 9.87}
    assert log_rows.child_log_facts(FRESH_LOG) == {"ahead": False, "collected": False, "session_s": 12.5}
    assert log_rows.child_log_facts("") == {"ahead": False, "collected": False}
    again = AHEAD_LOG.replace("......", "cutile-perf: the checkout provides pluggy: running as a fresh child instead\n......")
    assert log_rows.child_log_facts(again)["started_again"] == "the checkout provides pluggy"


def test_with_runs_each_stage_is_printed_with_what_its_log_says(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "2-correctness.log").write_text(AHEAD_LOG)
    row = {"iteration": 2, "status": "revert", "timings": {"total_s": 24.3, "stages": [["2-correctness", 17.784],
                                                                                       ["2-perf", 6.05]]}}
    log = tmp_path / "experiments.jsonl"
    log.write_text(json.dumps(row) + "\n")
    assert log_rows.main([str(log), "--runs", str(runs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("row 2: revert")
    # The stage outside pytest's session (17.8 - 5.69), and a wait near 0 s: let go before it was ready.
    assert out[1] == ("  2-correctness: 17.8 s, pytest session 5.69 s, outside it 12.1 s, started ahead, "
                      "6 preloads in 3.03 s, waited 0.01 s at the gate, ready 9.87 s after it began")
    assert len(out) == 2  # 2-perf has no log here: nothing is made up for it
    # A perf child held during the correctness run is timed from its gate, its session from before.
    (runs / "2-perf.log").write_text(FRESH_LOG)
    assert log_rows.main([str(log), "--runs", str(runs)]) == 0
    assert capsys.readouterr().out.splitlines()[2] == (
        "  2-perf: 6.0 s, pytest session 12.50 s, begun while it was held at its gate")
    assert log_rows.main([str(log), "--bogus"]) == 2


# The first and last lines of a child collected ahead on the H200 (session 25, call 2).
COLLECTED_LOG = """\
$ /opt/torch/.venv/bin/python -m pytest tests/ops/test_rms_norm.py -k test_perf and cutile and not cutile_rs -q --print-record -p no:cutile_perf -p cutile_perf.pytest_plugin (in the sandbox) (collected ahead of its turn)
1 passed, 77 deselected in 22.98s
"""


def test_a_child_collected_ahead_is_named_so_and_its_session_is_not_read_as_its_stage():
    facts = log_rows.child_log_facts(COLLECTED_LOG)
    assert facts == {"ahead": False, "collected": True, "session_s": 22.98}
    line = log_rows.stage_line("1-confirm1-base-perf", 3.4, facts)
    assert "collected ahead" in line and "outside it" not in line, line


def test_a_row_whose_re_check_settled_early_says_after_how_many_pairs():
    row = {"iteration": 2, "status": "keep", "timings": {"total_s": 50.0, "recheck_runs": 4},
           "decision": {"settled_after": 2}, "reason": "x" * 300}
    line = log_rows.row_line(row)
    assert "settled after 2 pair(s); " in line and line.endswith("x" * 160)
    assert "settled" not in log_rows.row_line({**row, "decision": {"settled_after": None}})
