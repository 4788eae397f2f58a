"""The physics floor of checked timed calls (issue 39 item 3): bytes the checked call's tensors
move over measured copy bandwidth; a record below it is refused (pure functions, CPU)."""
from __future__ import annotations

import pytest

from cutile_perf.judge.floor import FLOOR_MARGIN, floor_ms, floor_verdict


def test_floor_is_bytes_over_bandwidth():
    assert floor_ms(10**9, 1000.0) == 1.0


def test_record_below_the_floor_is_implausible_and_named():
    # 1 GB at 1000 GB/s: 1 ms; a record of 0.1 ms is beyond any margin.
    why = floor_verdict("64x16384", 0.1, 2.0, 10**9, 1000.0)
    assert why and "64x16384" in why and "below its floor" in why


def test_record_above_the_floor_passes():
    assert floor_verdict("64x16384", 1.5, 2.0, 10**9, 1000.0) is None


def test_no_floor_where_the_baseline_itself_is_under_it():
    # A baseline below the bytes floor reads less than its tensors: bytes are no floor there.
    assert floor_verdict("c", 0.01, 0.05, 10**9, 1000.0) is None


def test_no_bandwidth_no_floor():
    assert floor_verdict("c", 0.0001, 1.0, 10**9, None) is None
    assert floor_verdict("c", 0.0001, 1.0, 0, 1000.0) is None


def test_cpu_bandwidth_is_measured_once_and_positive():
    torch = pytest.importorskip("torch", reason="the copy benchmark needs torch")
    from cutile_perf.child.checked import bandwidth

    bw = bandwidth(torch)
    assert bw["flushed"] > 0 and bw["not flushed"] > 0 and "simulated" in bw["device"]
    assert FLOOR_MARGIN >= 1


def _judge(checks, shapes):
    from cutile_perf.judge.verdict import Reference, Stage, judge_checks

    ref = Reference(commit="base", medians={"64x16384": 2.0}, noise={"64x16384": 0.02})
    return judge_checks(Stage(name="perf", shapes=shapes, checks=tuple(checks)), ref)


def test_judge_refuses_a_record_under_the_floor_as_implausible():
    verdict = _judge([{"case": "64x16384", "status": "ok", "bytes": 10**9, "gbps": 1000.0}], {"64x16384": 0.1})
    assert verdict.final and "implausible" in verdict.reason and "64x16384" in verdict.reason


def test_judge_refuses_a_mismatch_naming_case_and_call():
    verdict = _judge([{"case": "64x16384", "status": "mismatch", "timer": "benchmark_fn_cupti", "ordinal": 7,
                       "reason": "rows 32.. differ"}], {"64x16384": 1.5})
    assert verdict.final and "wrong-when-timed" in verdict.reason
    assert "64x16384" in verdict.reason and "call 7" in verdict.reason


def test_judge_lets_an_honest_record_through():
    verdict = _judge([{"case": "64x16384", "status": "ok", "bytes": 10**9, "gbps": 1000.0}], {"64x16384": 1.5})
    assert not verdict.final


def test_unchecked_calls_are_said_on_the_row_and_in_status():
    from cutile_perf.child.checkrun import row_fields
    from cutile_perf.judge.verdict import Stage

    run = Stage(name="perf", checks=(
        {"case": "4x512", "ordinal": 3, "timer": "benchmark_fn", "status": "ok"},
        {"case": "64x16384", "ordinal": 9, "timer": "benchmark_fn", "status": "unchecked",
         "reason": "the base kernel's two results on the same inputs differ (random output, e.g. dropout)"}))
    fields = row_fields([run, None])
    assert "1 ok" in fields["checked"] and "1 unchecked" in fields["checked"] and "random output" in fields["checked"]
    assert fields["unchecked"] == [{"case": "64x16384", "call": 9, "timer": "benchmark_fn",
                                    "why": "the base kernel's two results on the same inputs differ (random output, "
                                           "e.g. dropout)"}]
    assert "copy_floor_ms" not in fields  # the ok call carried no bytes
    assert row_fields([Stage(name="perf")]) == {}
    from cutile_perf.loop.render import summarize_session

    entries = [{"iteration": 0, "status": "keep", "shapes": {}},
               {"iteration": 1, "status": "revert", "shapes": {}, **fields}]
    assert summarize_session(entries)["unchecked"] == [{"iteration": 1, "calls": fields["unchecked"]}]


def test_uncovered_perf_cases_by_test_id_parameters():
    from cutile_perf.child.checkrun import uncovered_perf_cases

    correctness = ["t.py::test_op[cutile-4-64]", "t.py::test_op[cutile-8-256]", "t.py::test_op[cutile-64-16384]"]
    perf = ["t.py::test_perf[cutile-4-512]", "t.py::test_perf[cutile-64-16384]", "t.py::test_perf[cutile-8-256]",
            "t.py::test_perf[cutile]"]
    assert uncovered_perf_cases(correctness, perf) == ["t.py::test_perf[cutile-4-512]"]
    assert uncovered_perf_cases([], ["t.py::test_perf[float16-8192]"]) == ["t.py::test_perf[float16-8192]"]
    assert uncovered_perf_cases(["t.py::test_op[1e-3-8]"], ["t.py::test_perf[8]"]) == []


def test_the_row_carries_each_case_s_copy_floor_from_its_checked_calls():
    from cutile_perf.child.checkrun import row_fields
    from cutile_perf.judge.verdict import Stage

    calls = ({"case": "64x16384", "status": "ok", "bytes": 6 * 10**9, "gbps": 3000.0},  # 2 ms
             {"case": "64x16384", "status": "ok", "bytes": 6 * 10**9, "gbps": 4000.0},  # 1.5 ms: the most kept
             {"case": "4x512", "status": "ok", "bytes": 0, "gbps": 3000.0},  # no bytes: no floor
             {"case": "8x512", "status": "mismatch", "bytes": 10**9, "gbps": 3000.0})
    assert row_fields([Stage(name="perf", checks=calls)])["copy_floor_ms"] == {"64x16384": 2.0}
