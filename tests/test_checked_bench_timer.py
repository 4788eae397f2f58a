"""``cutile_perf.bench.bench_record`` is checked like a target's timer (``pytest_plugin.checked_timers.wrap_bench``).

The bundled kernels' perf tests time through ``tests/common.record_benchmark``, a helper that no timer
classification names; before this, their timed calls got neither the base kernel's replay nor a
floor (H100, session 41: the honest controls' rows carried no ``checked`` field). These tests use a
stand-in for ``bench_record`` (the real one needs a GPU) with bench's own mode table."""
from __future__ import annotations

import types

import pytest

from cutile_perf import bench
from cutile_perf.child import checked
from cutile_perf.pytest_plugin import checked_timers
from cutile_perf.pytest_plugin.identity import TimerIdentity

torch = pytest.importorskip("torch", reason="checked timed calls capture torch tensors")


def _stand_in_bench():
    """A module with bench's mode table and a ``bench_record`` that calls ``fn`` as a timer would."""
    def bench_record(fn, *, mode=None, **_):
        bench.check_mode(mode)  # the real one refuses an unknown mode
        for _ in range(4):
            fn()
        return {"median": 1.0}
    return types.SimpleNamespace(bench_record=bench_record, MODE_TIMERS=bench.MODE_TIMERS,
                                 check_mode=bench.check_mode)


@pytest.fixture
def capture(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(checked, "SETUP", None)
    checked.configure(checked.CAPTURE, tmp_path, lines.append)
    checked.begin_test("tests/ops/test_softmax.py::test_perf[4096-float16]")
    return lines


@pytest.mark.parametrize(("mode", "method", "l2"), [
    ("cold", "events", "flushed"), ("warm", "events", "not flushed"),
    ("graph", "cuda-graph", "flushed"), ("graph-warm", "cuda-graph", "not flushed"),
    ("cupti", "cupti", "flushed"), ("cupti-warm", "cupti", "not flushed"),
])
def test_each_bench_mode_is_captured_under_its_own_conditions(capture, mode, method, l2):
    module = _stand_in_bench()
    checked_timers.wrap_bench(module)
    x = torch.arange(256.0)
    assert module.bench_record(lambda: x * 2, mode=mode) == {"median": 1.0}
    (line,) = capture
    assert (line["timer"], line["method"], line["l2"]) == ("cutile_perf.bench.bench_record", method, l2)
    assert line["status"] == "captured" and line["calls"] == 4 and line["bytes"] > 0  # bytes: the floor's


def test_the_mode_comes_from_the_environment_when_not_given_and_a_bad_one_is_the_timers_to_refuse(
        capture, monkeypatch):
    module = _stand_in_bench()
    checked_timers.wrap_bench(module)
    checked_timers.wrap_bench(module)  # wrapped once, however often asked
    monkeypatch.setenv("CUTILE_PERF_BENCH_MODE", "warm")
    x = torch.arange(256.0)
    module.bench_record(lambda: x + 1)
    assert [(line["method"], line["l2"]) for line in capture] == [("events", "not flushed")]
    with pytest.raises(ValueError, match="bench mode"):
        module.bench_record(lambda: x + 1, mode="nope")
    assert len(capture) == 1  # nothing captured for a call the timer refused


def test_the_plugin_wraps_bench_before_guarding_it(capture, monkeypatch):
    monkeypatch.setattr(bench, "bench_record", bench.bench_record)  # put back after the test
    measure = bench.measure
    identity = TimerIdentity(None)
    identity.capture("cutile_perf.bench")
    assert getattr(bench.bench_record, "__cutile_perf_checked__", False)
    assert bench.measure is measure  # the tuner's timer (bench.bench, measure) stays as it is
    assert identity.captured["cutile_perf.bench.bench_record"][2] is bench.bench_record  # the wrapper is guarded
    assert identity.check("at the end") == []
