"""``screen --gpus 2`` on the SIMULATED TileGym-shaped repo with two SIMULATED GPUs
(``CUDA_VISIBLE_DEVICES=0,1``, no nvidia-smi): the candidates are dealt to two workers, each compares
its own with the base on its one GPU, and the ranking is what one process gives (issue 41 item 2)."""
from __future__ import annotations

import pytest
from fixtures_repo import build_tilegym_like_repo
from redteam_helpers import call

from test_screen import baselined_with_candidates

from cutile_perf.loop.screen_spread import deal

LATENCY = {"fast": {"256x1024": 0.5, "4096x1024": 1.0}, "slow": {"256x1024": 1.5, "4096x1024": 3.0}}
EXPECTED_RATIO = {"fast": 0.5, "slow": 1.5}  # against the fixture's base latencies (1.0, 2.0)


def test_candidates_are_dealt_round_robin_and_no_group_is_empty():
    assert deal(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    assert deal(["a"], 4) == [["a"]]
    assert deal([], 2) == []


def test_rounds_spread_over_two_gpus_rank_as_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    repo, _cand = baselined_with_candidates(tmp_path, LATENCY)
    code, data, text = call(repo, "screen", "sandbox/cand/*.py", "--gpus", "2")
    assert code == 0, text
    assert [r["name"] for r in data["ranked"]] == ["fast", "slow"]
    for reading in data["ranked"]:
        assert reading["geomean"] == pytest.approx(EXPECTED_RATIO[reading["name"]], rel=0.05)
    # each candidate compared on one worker, the two on different GPUs; the wrong one never timed
    assert sorted(data["workers"]) == ["fast", "slow"] and len(set(data["workers"].values())) == 2, data["workers"]
    assert data["not_ranked"]["wrong"]["state"] == "fails correctness"
    runs = sorted(p.name for p in (repo / "sandbox/runs").glob("screen-w*-r1-*perf.log"))
    assert any(n.startswith("screen-w0-") for n in runs) and any(n.startswith("screen-w1-") for n in runs), runs


def test_more_gpus_than_the_node_offers_is_one_line_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    repo = build_tilegym_like_repo(tmp_path)  # no session even: --gpus is checked first
    code, data, _text = call(repo, "screen", "sandbox/cand/*.py", "--gpus", "3")
    assert code == 2 and "this node offers 1 GPU" in data["error"], data


def test_each_worker_times_the_cases_asked_for(tmp_path, monkeypatch):
    """``--cases 1`` reaches every worker: each run of each worker selects the one case, and the
    readings rest on it."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    repo, _cand = baselined_with_candidates(tmp_path, LATENCY)
    code, data, text = call(repo, "screen", "sandbox/cand/*.py", "--gpus", "2", "--cases", "1")
    assert code == 0, text
    assert data["cases"] == {"timed": ["256x1024"], "of": 2}
    assert {name: list(r["cases"]) for name, r in ((r["name"], r) for r in data["ranked"])} == \
        {"fast": ["256x1024"], "slow": ["256x1024"]}
    logs = list((repo / "sandbox/runs").glob("screen-w*-r1-*perf.log"))
    assert len(logs) == 4, logs  # each worker: the base's run and its candidate's
    assert all("4096x1024" not in log.read_text() for log in logs)
