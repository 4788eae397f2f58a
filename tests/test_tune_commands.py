"""probe / ab / prune end to end on CPU: a fake Tunable, fake launcher and FakeBench timings."""
from __future__ import annotations

import numpy as np
import pytest
from optional_deps import needs

from cutile_perf.cli import main
from cutile_perf.commands.ab import ab
from cutile_perf.commands.probe import probe
from cutile_perf.commands.prune import prune
from cutile_perf.errors import UsageError
from cutile_perf.tune import Config, DeviceInfo, FakeBench
from cutile_perf.tune.analysis import keep_set, prune as prune_rule
from cutile_perf.tune.config import Trial
from cutile_perf.tune.tunable import Problem, Tunable, parse_dim, parse_shape
from tests.test_tune_autotuner import FakeKernel, FakeLauncher

FIXED = Config(TILE=64)


def _problem(shape):
    x = np.zeros(shape["N"])
    return Problem(lambda cfg: (shape["N"] // cfg.TILE,), lambda cfg: (x, cfg.TILE), inplace=(0,))


FAKE_TUNABLE = Tunable(name="fake", kernel=FakeKernel(), fixed=FIXED,
                       space=lambda arch: [Config(TILE=t, occupancy=o) for t in (64, 128) for o in (1, 2)],
                       shapes=({"N": 1024}, {"N": 4096}), problem=_problem)
TARGET = "tests.test_tune_commands:FAKE_TUNABLE"


def fake_time(cfg):
    # TILE=128 occupancy=2 is best; the fixed config (no hints) is 1.0.
    return 1.0 - 0.1 * (cfg.TILE == 128) - 0.05 * (cfg.get("occupancy") == 2)


def fakes(**extra):
    return {"timer": FakeBench(fake_time), "precompile": None, "launcher": FakeLauncher(),
            "device": DeviceInfo("FAKE H200", (9, 0)), **extra}


def test_probe_ranks_and_keeps_at_most_eight():
    out = probe(target=TARGET, dims=["TILE=32,64,128", "occupancy=1,2,4"], shapes=None, fakes=fakes())
    assert out.data["ranked"][0]["config"] == {"TILE": 128, "occupancy": 2}
    assert out.data["keep"][0] == {"TILE": 64}  # the fixed config always stays
    assert {"TILE": 128, "occupancy": 2} in out.data["keep"] and len(out.data["keep"]) <= 8
    assert "rank  geomean" in out.text


def test_probe_refuses_more_than_the_limit():
    with pytest.raises(UsageError, match="probe would time 12 configs"):
        probe(target=TARGET, dims=["TILE=16,32,64,128", "occupancy=1,2,4"], shapes=None, max_configs=10, fakes=fakes())


def test_prune_drops_configs_that_never_come_close():
    out = prune(target=TARGET, shapes=["N=2048"], tolerance=0.02, fakes=fakes())
    assert out.data["keep"] == [{"TILE": 64}, {"TILE": 128, "occupancy": 2}]
    assert all(d["reason"] for d in out.data["drop"]) and len(out.data["drop"]) == 3


def test_ab_reports_ci_and_verdict_per_shape():
    confirm = FakeBench(lambda c: [fake_time(c) * (1 + 0.001 * i) for i in range(20)])
    out = ab(target=TARGET, shapes=None, fakes=fakes(confirm=confirm))
    assert out.exit_code == 0
    assert [r["verdict"] for r in out.data["rows"]] == ["faster", "faster"]
    low, high = out.data["rows"][0]["ci"]
    assert low <= out.data["rows"][0]["ratio"] <= high < 1.0


def test_ab_exit_1_when_tuning_loses():
    # The search saw TILE=128 as best, but the confirmation timing says it is slower: exit 1.
    confirm = FakeBench(lambda c: [(2.0 if c.get("TILE") == 128 else 1.0) + 0.001 * i for i in range(20)])
    out = ab(target=TARGET, shapes=["N=1024"], fakes=fakes(confirm=confirm))
    assert out.exit_code == 1 and out.data["slower_shapes"] == ["N=1024"]


@needs("torch")
def test_cli_without_gpu_refuses_with_exit_3(capsys):
    from tests.conftest import gpu_skip_reason

    if gpu_skip_reason() is None:
        pytest.skip("a GPU is present")
    assert main(["prune", "--target", TARGET]) == 3
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


def test_cli_bad_target_is_usage_error(capsys):
    assert main(["probe", "--target", "nocolon", "--dim", "TILE=1"]) == 2
    assert "expected module:attribute" in capsys.readouterr().err


def test_parsers():
    assert parse_shape("M=4096, N=1024") == {"M": 4096, "N": 1024}
    assert parse_dim("layout=row,col") == ("layout", ["row", "col"])
    with pytest.raises(UsageError):
        parse_shape("M=big")


def test_keep_set_covers_every_shape_greedily():
    a, b, c = Config(x=1), Config(x=2), Config(x=3)
    results = {"s1": [Trial(a, (1.0,)), Trial(b, (2.0,)), Trial(c, (1.01,))],
               "s2": [Trial(a, (2.0,)), Trial(b, (1.0,)), Trial(c, (1.02,))]}
    assert keep_set(results, tolerance=0.05) == [c]  # one config within 5 % everywhere beats two winners
    kept, dropped = prune_rule(results, tolerance=0.05, must_keep=[a])
    assert kept == [a, c] and [d[0] for d in dropped] == [b]
