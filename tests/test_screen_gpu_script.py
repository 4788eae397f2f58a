"""The CPU-runnable parts of benchmarks/screen_gpu.py, so its one GPU call does not fail on a typo:
each candidate's appended change re-registers the op and does what its name says; the expectations
read a screen's JSON as intended."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
MODULE = '''
import torch

REGISTRY = {}


def register_impl(name, backend):
    def decorator(func):
        REGISTRY[(name, backend)] = func
        return func
    return decorator


CALLS = []


@register_impl("op", backend="cutile")
def op(x):
    CALLS.append(1)
    return x * 2
'''


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("screen_gpu", BENCH / "screen_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_candidate(script, name: str) -> tuple[object, int]:
    namespace: dict = {}
    exec(compile(MODULE + script.change_text(name, "op"), f"{name}.py", "exec"), namespace)  # noqa: S102
    torch = namespace["torch"]
    out = namespace["REGISTRY"][("op", "cutile")](torch.ones(3))
    return out, namespace["CALLS"]


def test_each_candidate_re_registers_the_op_and_does_what_it_says(script):
    out, calls = run_candidate(script, "comment")
    assert out.tolist() == [2.0, 2.0, 2.0] and calls == [1]
    out, calls = run_candidate(script, "twice")
    assert out.tolist() == [2.0, 2.0, 2.0] and calls == [1, 1]
    out, calls = run_candidate(script, "wrong")
    assert out.tolist() == [0.0, 0.0, 0.0]
    compile(script.change_text("sleep", "op"), "sleep.py", "exec")  # valid; the sleep itself needs a GPU
    assert "torch').cuda._sleep(" in script.change_text("sleep", "op")


def test_defaults_and_bad_arguments(script):
    args = script.parse_args(["slice"])
    assert (args.op, args.fn, args.seconds) == ("silu_and_mul", "silu_and_mul", 0.0)
    assert script.parse_args(["s", "--op", "activation/geglu"]).fn == "geglu"
    assert args.hints == 0 and script.parse_args(["s", "--hints", "4"]).hints == 4
    assert (args.cases, args.plain_runs) == (None, 2)
    assert script.parse_args(["s", "--cases", "3", "--plain-runs", "0"]).cases == 3
    for bad in (["--seconds", "-1"], ["--hints", "-1"], ["--plain-runs", "3"]):
        with pytest.raises(SystemExit) as exc:
            script.parse_args(["s", *bad])
        assert exc.value.code == 2


def test_expectations_accept_the_known_order_and_name_each_contradiction(script):
    good = {"ranked": [{"name": "comment", "geomean": 1.01}, {"name": "sleep", "geomean": 1.2},
                       {"name": "twice", "geomean": 1.9}],
            "not_ranked": {"wrong": {"state": "fails correctness"}}}
    assert script.expectations(good) == []
    bad = {"ranked": [{"name": "twice", "geomean": 1.1}, {"name": "comment", "geomean": 1.2}],
           "not_ranked": {}}
    problems = script.expectations(bad)
    assert len(problems) == 4, problems
