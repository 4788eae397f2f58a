"""``survey --gpus N --engine local``: ops spread over a worker per (simulated) GPU give the rows the
one-process survey gives. No GPU needed: the GPUs are CUDA_VISIBLE_DEVICES entries nvidia-smi does not list."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_ops import add_simulated_softmax
from fixtures_repo import git, tilegym_like_repo  # noqa: F401

from cutile_perf.cli import main
from cutile_perf.kernel import survey
from cutile_perf.loop import survey_spread


@pytest.fixture
def two_op_repo(tilegym_like_repo):
    pytest.importorskip("torch")
    return add_simulated_softmax(tilegym_like_repo)


def cli(capsys, repo: Path, *args: str) -> tuple[int, dict, str]:
    code = main(["survey", "--repo", str(repo), "--json", *args])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    return code, (json.loads(lines[-1]) if lines else {}), captured.err


def _comparable(data: dict) -> dict:
    """Each op's row without its timings (they differ run to run)."""
    ops = {}
    for op in data["ops"]:
        runs = {w: {k: v for k, v in r.items() if k != "wall_s"} for w, r in op["runs"].items()}
        ops[op["op"]] = {**op, "runs": runs}
    return ops


def test_ops_spread_over_two_gpus_give_the_rows_of_the_one_process_survey(two_op_repo, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    code_one, one, _ = cli(capsys, two_op_repo, "--run", "--timeout", "120")
    code_two, two, _ = cli(capsys, two_op_repo, "--run", "--timeout", "120", "--gpus", "2")
    assert code_one == code_two == 0
    assert _comparable(two) == _comparable(one)
    assert two["summary"] == one["summary"] and two["summary"]["drivable"] == 1  # softmax has no perf test
    assert git(two_op_repo, "status", "--porcelain", "--untracked-files=all").strip() == ""


def test_more_gpus_than_the_node_offers_is_one_line_and_exit_2(two_op_repo, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    code, data, _ = cli(capsys, two_op_repo, "--gpus", "3")
    assert code == 2 and "--gpus 3: this node offers 2 GPU(s)" in data["error"]


def test_a_row_crosses_a_worker_as_data_unchanged(two_op_repo):
    rows = survey.survey(two_op_repo)
    assert [survey.OpRow.from_data(json.loads(json.dumps(r.to_data()))) for r in rows] == rows


def test_an_op_whose_worker_failed_is_a_row_that_says_so(tmp_path):
    kernel = tmp_path / "src" / "op.py"
    row = survey_spread._row(tmp_path, kernel, {"status": "lost", "error": "its worker died 2 time(s)"})
    assert row.kernel == "src/op.py" and row.problem == "its worker failed: its worker died 2 time(s)"
    assert not row.drivable


def test_one_gpu_on_the_local_engine_starts_no_worker(two_op_repo, capsys, monkeypatch):
    # The default path stays in this process: no pool, no process hop (issue 41: nothing slower on one GPU).
    def no_pool(*args, **kwargs):
        raise AssertionError("the one-GPU survey built a worker pool")

    monkeypatch.setattr(survey_spread, "spreader", no_pool)
    code, data, _ = cli(capsys, two_op_repo, "--gpus", "1")
    assert code == 0 and data["summary"]["ops"] == 2
