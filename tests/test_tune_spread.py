"""``probe``/``prune``/``ab --gpus N|all``: each shape timed by one worker of the node's pool (issue 41 item 2),
on the CPU with SIMULATED GPUs (``CUDA_VISIBLE_DEVICES=0,1`` and no nvidia-smi) and the fake tunable,
launcher and timings of tests/test_tune_commands.py, which the workers import by name."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from cutile_perf.cli import main
from cutile_perf.commands.ab import ab
from cutile_perf.commands.probe import probe
from cutile_perf.commands.prune import prune
from cutile_perf.errors import IterationCrashed, UsageError
from cutile_perf.loop import tune_spread
from cutile_perf.tune.config import Config

ROOT = Path(__file__).resolve().parents[1]
TARGET = "tests.test_tune_commands:FAKE_TUNABLE"
FAKES = "tests.test_tune_commands:fakes"
AB_FAKES = "tests.test_tune_spread:ab_fakes"


def ab_fakes():
    """The fakes with a confirmation timer that sees the tuned config faster (as ``ab``'s own test)."""
    from tests.test_tune_commands import FakeBench, fake_time, fakes  # noqa: PLC0415 - what the workers import by name

    return fakes(confirm=FakeBench(lambda c: [fake_time(c) * (1 + 0.001 * i) for i in range(20)]))
DIMS = ["TILE=32,64,128", "occupancy=1,2,4"]


@pytest.fixture
def two_gpus(monkeypatch):
    """Two simulated GPUs, and the workers able to import the fakes by name."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    path = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))


def test_shapes_spread_over_two_gpus_rank_as_one_process_does(two_gpus):
    one = probe(target=TARGET, dims=DIMS, shapes=None, fakes=FAKES)
    two = probe(target=TARGET, dims=DIMS, shapes=None, fakes=FAKES, gpus="2")
    assert two.data["ranked"] == one.data["ranked"] and two.data["keep"] == one.data["keep"]
    assert two.data["shapes"] == one.data["shapes"] == ["N=1024", "N=4096"]
    assert two.data["ranked"][0]["config"] == {"TILE": 128, "occupancy": 2}


def test_one_gpu_on_the_local_engine_starts_no_worker(monkeypatch):
    def no_pool(*args, **kwargs):
        raise AssertionError("--gpus 1 must time in this process")

    monkeypatch.setattr(tune_spread.node, "run_tasks", no_pool)
    assert probe(target=TARGET, dims=DIMS, shapes=None, fakes=FAKES).data["ranked"]


def test_a_shape_whose_worker_gave_no_result_is_named(monkeypatch):
    def lost(*, tasks, **kwargs):
        return {task: {"status": "lost", "error": "its worker died 2 time(s)"} for task in tasks}

    monkeypatch.setattr(tune_spread.node, "run_tasks", lost)
    with pytest.raises(UsageError, match=r"shape N=1024: its worker gave no result \(its worker died 2 time"):
        tune_spread.run_spread(TARGET, [Config(TILE=64)], [{"N": 1024}], gpus="2", engine="local", fakes=FAKES)


def test_fakes_cross_to_a_worker_only_by_name():
    with pytest.raises(UsageError, match="only by name"):
        tune_spread.run_spread(TARGET, [Config(TILE=64)], [{"N": 1024}], gpus="2", engine="local", fakes={})


def test_more_gpus_than_the_node_offers_is_refused_with_one_line(two_gpus):
    with pytest.raises(UsageError, match=r"--gpus 3: this node offers 2 GPU\(s\)"):
        probe(target=TARGET, dims=DIMS, shapes=None, fakes=FAKES, gpus="3")


def test_the_command_line_hands_gpus_and_engine_to_probe(monkeypatch, capsys):
    import cutile_perf.commands.probe as probe_module

    seen = {}

    def fake_probe(**kwargs):
        seen.update(kwargs)
        return probe(**{**kwargs, "fakes": FAKES, "gpus": "1", "engine": "local"})

    monkeypatch.setattr(probe_module, "probe", fake_probe)
    code = main(["probe", "--target", TARGET, "--dim", "TILE=32,64", "--gpus", "all", "--engine", "ray", "--json"])
    assert code == 0, capsys.readouterr()
    assert (seen["gpus"], seen["engine"]) == ("all", "ray")


def test_prune_spread_over_two_gpus_keeps_what_one_process_keeps(two_gpus):
    one = prune(target=TARGET, shapes=None, tolerance=0.02, fakes=FAKES)
    two = prune(target=TARGET, shapes=None, tolerance=0.02, fakes=FAKES, gpus="2")
    assert two.data == one.data and two.data["shapes"] == ["N=1024", "N=4096"]


def test_ab_spread_over_two_gpus_gives_one_process_rows(two_gpus):
    one = ab(target=TARGET, shapes=None, fakes=ab_fakes())
    two = ab(target=TARGET, shapes=None, fakes=AB_FAKES, gpus="2")
    assert two.data == one.data and two.exit_code == one.exit_code == 0
    assert [r["shape"] for r in two.data["rows"]] == ["N=1024", "N=4096"]


def test_an_ab_shape_whose_worker_failed_is_named(monkeypatch):
    def failed(*, tasks, **kwargs):
        return {task: {"status": "error", "error": "IterationCrashed: every config failed"} for task in tasks}

    monkeypatch.setattr(tune_spread.node, "run_tasks", failed)
    with pytest.raises(IterationCrashed, match=r"shape N=1024: IterationCrashed: every config failed"):
        tune_spread.ab_spread(TARGET, [Config(TILE=64)], [{"N": 1024}], rep_ms=10, gpus="2", engine="local",
                              fakes=AB_FAKES)


def test_the_command_line_hands_gpus_and_engine_to_ab_and_prune(monkeypatch, capsys):
    import cutile_perf.commands.ab as ab_module
    import cutile_perf.commands.prune as prune_module

    seen = {}
    monkeypatch.setattr(ab_module, "ab", lambda **kw: seen.setdefault("ab", kw) and ab(
        **{**kw, "fakes": AB_FAKES, "gpus": "1", "engine": "local"}))
    monkeypatch.setattr(prune_module, "prune", lambda **kw: seen.setdefault("prune", kw) and prune(
        **{**kw, "fakes": FAKES, "gpus": "1", "engine": "local"}))
    assert main(["ab", "--target", TARGET, "--gpus", "2", "--json"]) == 0, capsys.readouterr()
    assert main(["prune", "--target", TARGET, "--engine", "ray", "--json"]) == 0, capsys.readouterr()
    assert (seen["ab"]["gpus"], seen["ab"]["engine"]) == ("2", "local")
    assert (seen["prune"]["gpus"], seen["prune"]["engine"]) == ("1", "ray")
