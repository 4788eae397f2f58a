"""benchmarks/tilegym_campaign.py on the CPU: the pure parts (which ops run, a log's table line) and
one whole campaign over the SIMULATED TileGym-shaped repository (tests/fixtures_repo.py) through the
node's worker pool, one CPU worker: survey, init, baseline, screen, batch, the table. The GPU run is
the campaign of issue 41 item 4."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from fixtures_repo import build_tilegym_like_repo, kernel_source

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def campaign():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("tilegym_campaign")
    finally:
        sys.path.remove(str(BENCH))


def row(iteration, status, medians, optimization="", moved=False):
    """A log row as far as the table reads it (``rules.moved_performance``, ``log.shape_medians``)."""
    return {"iteration": iteration, "status": status, "optimization": optimization,
            "shapes": {c: {"median": m} for c, m in medians.items()}, "decision": {"rebaseline": moved}}


def test_a_table_line_names_the_kept_change_the_session_now_compares_with(campaign):
    rows = [row(0, "keep", {"a": 1.0, "b": 4.0}), row(1, "keep", {"a": 0.5, "b": 2.0}, "fast", moved=True),
            row(2, "keep", {"a": 0.51, "b": 2.0}, "comment"),  # kept within noise: not the reference
            row(3, "revert", {"a": 2.0, "b": 8.0}, "slow")]
    line = campaign.op_row("op", rows, screened=3)
    assert line["best"] == "fast" and line["speedup"] == pytest.approx(2.0) and line["decided"] == 3
    assert line["base_geomean_ms"] == pytest.approx(2.0)
    assert campaign.op_row("op", rows[:1], 0)["best"] is None and campaign.op_row("op", [], 0)["note"] == "no baseline"
    assert line["roofline"] is None  # no row had checked calls


def test_the_copy_roofline_share_is_the_floors_over_the_best_row_s_medians(campaign):
    rows = [row(0, "keep", {"a": 1.0, "b": 4.0}),
            {**row(1, "keep", {"a": 0.5, "b": 2.0}, "fast", moved=True), "copy_floor_ms": {"a": 0.4, "b": 0.4}},
            row(2, "revert", {"a": 2.0, "b": 8.0}, "slow")]  # a revert: the floors of row 1 still hold
    line = campaign.op_row("op", rows, screened=2)
    assert line["roofline"] == pytest.approx((0.8 * 0.2) ** 0.5)  # geomean of 0.4/0.5 and 0.4/2.0
    assert "| 40 % |" in campaign.render([line], {})


def test_plan_runs_drivable_ops_with_candidates_and_says_why_not_for_the_rest(campaign, tmp_path):
    for op, files in {"rms_norm": ["a.py"], "softmax": ["b.py"], "gone": ["c.py"], "empty": []}.items():
        (tmp_path / op).mkdir()
        for f in files:
            (tmp_path / op / f).write_text("")
    survey = [{"op": "rms_norm", "drivable": True}, {"op": "softmax", "drivable": False, "needs_cuda": "no CUDA"},
              {"op": "empty", "drivable": True}]
    run, skipped = campaign.plan_ops(survey, tmp_path)
    assert run == ["rms_norm"]
    assert skipped == {"softmax": "not drivable: no CUDA", "gone": "not an op of this repository",
                       "empty": "no candidate files"}


def test_bad_arguments_exit_2(campaign, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        campaign.parse_args([str(tmp_path), str(tmp_path), "--out", str(tmp_path), "--top", "0"])
    assert exc.value.code == 2


@pytest.mark.slow
def test_a_campaign_over_the_simulated_repo_decides_the_best_candidate(campaign, tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    cands = tmp_path / "cands"
    (cands / "rms_norm").mkdir(parents=True)
    # base latencies 1.0 and 2.0 ms: "fast" halves both, "slow" adds half
    (cands / "rms_norm" / "fast.py").write_text(kernel_source({"256x1024": 0.5, "4096x1024": 1.0}))
    (cands / "rms_norm" / "slow.py").write_text(kernel_source({"256x1024": 1.5, "4096x1024": 3.0}))
    (cands / "layer_norm").mkdir()
    (cands / "layer_norm" / "x.py").write_text("")
    out = tmp_path / "out"
    code = campaign.main([str(repo), str(cands), "--out", str(out), "--gpus", "1", "--no-gpu", "--top", "1",
                          "--screen-seconds", "0", "--job-seconds", "300", "--timeout", "120", "--repeats", "2"])
    data = json.loads((out / "campaign.json").read_text())
    assert code == 0, data
    (line,) = data["ops"]
    assert line["op"] == "rms_norm" and line["screened"] == 2 and line["decided"] == 1, line
    assert line["best"] == "fast" and line["speedup"] == pytest.approx(2.0, rel=0.1), line
    assert data["skipped"] == {"layer_norm": "not an op of this repository"}
    table = (out / "campaign.md").read_text()
    # the simulated kernel's latencies carry noise (1.4142 or 1.4143; 1.999x or 2.000x): the values are
    # checked above, the table only for its line
    assert "| rms_norm | 1.41" in table and "| fast | " in table and "skipped: not an op" in table
    assert (out / "rms_norm" / "experiments.jsonl").exists() and (out / "rms_norm" / "screen.md").exists()
