"""The pure parts of ``screen``: the ranking of paired readings, the round order, and the rounds that
fit the time given (driven by scripted stages and a scripted clock: no child, no repository)."""
from __future__ import annotations

import pytest

from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.rules import Thresholds
from cutile_perf.judge.verdict import Reference, Stage, paired_samples
from cutile_perf.loop import screen, screen_rank
from scripted_stages import ScriptedStages

CASES = ("a", "b")
BASE = {"a": 1.0, "b": 2.0}


def paired(*rounds: tuple[dict, dict]) -> dict:
    """case -> (base runs, candidate runs) from (base, candidate) medians per round."""
    return {c: ([b[c] for b, _ in rounds], [x[c] for _, x in rounds]) for c in CASES}


def test_rank_orders_by_geomean_and_reports_worst_case_interval_and_rounds():
    readings = screen_rank.rank({
        "slow": paired((BASE, {"a": 1.5, "b": 3.0})),
        "fast": paired((BASE, {"a": 0.5, "b": 1.0}), (BASE, {"a": 0.5, "b": 1.2})),
        "mixed": paired((BASE, {"a": 0.5, "b": 2.4})),  # one case faster, one slower
    })
    assert [r.name for r in readings] == ["fast", "mixed", "slow"]
    fast, mixed, slow = readings
    assert fast.rounds == 2 and slow.rounds == 1
    assert fast.cases == {"a": 0.5, "b": pytest.approx(0.55)}  # the median of 0.5 and 0.6
    assert fast.geomean == pytest.approx((0.5 * 0.55) ** 0.5)
    assert (fast.low, fast.high) == (pytest.approx(0.5), pytest.approx((0.5 * 0.6) ** 0.5))
    assert (mixed.worst_case, mixed.worst) == ("b", pytest.approx(1.2))
    assert slow.low == slow.high == pytest.approx(1.5)


def test_ratios_are_paired_within_a_round_not_across_rounds():
    # The base drifts 2x between rounds and the candidate with it: paired, the candidate is the same
    # speed; compared across rounds (medians of each side) it would look 25 % slower or faster.
    reading = screen_rank.reading("same", paired((BASE, BASE), ({"a": 2.0, "b": 4.0}, {"a": 2.0, "b": 4.0})))
    assert reading.geomean == pytest.approx(1.0) and reading.low == reading.high == pytest.approx(1.0)


def test_equal_geomeans_rank_by_worst_case_then_name():
    even = paired((BASE, {"a": 0.8, "b": 1.6}))
    uneven = paired((BASE, {"a": 0.64, "b": 2.0}))  # the same geomean (0.8), one case not faster
    assert [r.name for r in screen_rank.rank({"uneven": uneven, "z": even, "even": even})] == ["even", "z", "uneven"]


def test_a_candidate_without_a_complete_round_is_not_ranked():
    assert screen_rank.rank({"none": {c: ([], []) for c in CASES}}) == []
    base = Stage(name="perf", shapes=dict(BASE), ended=True)
    crashed = Stage(name="perf", ended=False, crash=CrashClass.ERROR)
    assert screen_rank.reading("x", paired_samples([(base, crashed)], CASES)) is None


def test_next_round_fits_only_when_it_can_end_in_time():
    assert screen_rank.next_round_fits(seconds=100, spent=70, per_run_s=10, runs=3)  # ends at 100
    assert not screen_rank.next_round_fits(seconds=100, spent=71, per_run_s=10, runs=3)


def test_round_order_rotates_so_each_candidate_follows_the_base_in_turn():
    names = ["x", "y", "z"]
    firsts = [screen.round_order(names, k)[0] for k in range(3)]
    assert sorted(firsts) == names
    assert screen.round_order(names, 3) == names and screen.round_order([], 2) == []


# --- the rounds, on scripted stages and a scripted clock -------------------------------------------


def perf_stage(medians: dict, seconds: float) -> Stage:
    return Stage(name="perf", shapes=dict(medians), ended=True, duration_s=seconds)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run_scripted(seconds: float, cand_c2: Stage | None = None):
    clock = Clock()
    script = {("perf", "base"): [perf_stage(BASE, 10)],
              ("perf", "c1"): [perf_stage({"a": 0.5, "b": 1.0}, 10)],
              ("perf", "c2"): [cand_c2 or perf_stage({"a": 1.5, "b": 3.0}, 10)]}
    stages = ScriptedStages(script, reference_commit="base")
    stages.on_stage = lambda name, tag, commit: setattr(clock, "t", clock.t + 10)  # every run takes 10 s
    ref = Reference(commit="base", medians=dict(BASE), noise={c: 0.01 for c in CASES})
    out = screen.ScreenResult(base="base", candidates=[])
    names = ["one", "two"]
    pairs = screen.run_rounds(stages, ref, Thresholds(), {"one": "c1", "two": "c2"}, names, seconds, 0.0, clock, out)
    return out, pairs, stages


def test_rounds_run_while_a_whole_round_still_fits_the_seconds_given():
    out, pairs, stages = run_scripted(seconds=100)
    # 30 s a round (base and two candidates): rounds end at 30, 60, 90; a fourth would end at 120.
    assert out.rounds == 3 and len(pairs["one"]) == 3
    assert [c[2] for c in stages.calls[:3]] == ["base", "c1", "c2"]
    assert [c[2] for c in stages.calls[3:6]] == ["base", "c2", "c1"], "the order rotates per round"


def test_timed_calls_are_checked_in_a_candidates_first_round_only():
    """Later rounds start no reference child (``Request.check``); the base is never checked against itself."""
    _out, _pairs, stages = run_scripted(seconds=100)
    assert sorted(stages.unchecked) == ["screen-r2-c1", "screen-r2-c2", "screen-r3-c1", "screen-r3-c2"]
    assert not any(tag.startswith("screen-r1-") for tag in stages.unchecked)


def test_at_least_one_round_runs_whatever_the_seconds():
    out, _pairs, _stages = run_scripted(seconds=0)
    assert out.rounds == 1


def test_a_candidate_whose_timed_run_crashes_is_dropped_from_the_rounds():
    out, pairs, stages = run_scripted(seconds=100, cand_c2=perf_stage({"a": 1.5}, 10))  # no record for case b
    assert out.dropped["two"][0] == screen.FAILS_PERF and "no record" in out.dropped["two"][1]
    assert "two" not in pairs
    assert [c[2] for c in stages.calls].count("c2") == 1, "never timed again"
    # Without it a round is 20 s: rounds end at 30, 50, 70, 90.
    assert out.rounds == 4


def test_the_runner_starts_no_reference_child_for_a_run_asked_unchecked(monkeypatch):
    """``StageRunner.run`` with a stand-in pool and clock (no child): ``check=False`` skips
    ``check_timed_calls``; the captures are discarded either way."""
    from cutile_perf.child import checkrun
    from cutile_perf.loop.stages import Request, StageRunner

    stage = perf_stage(BASE, 1.0)
    runner = StageRunner.__new__(StageRunner)  # only what ``run`` touches
    runner.pool = type("Pool", (), {"run": staticmethod(lambda request: stage)})()
    runner.clock = type("Clock", (), {"add_child": staticmethod(lambda seconds, label: None)})()
    runner.session = None
    runner._finish_filling = lambda: None
    checked, discarded = [], []
    runner.check_timed_calls = lambda result, commit, tag: checked.append(tag) or result
    monkeypatch.setattr(checkrun, "discard_captures", lambda session, result: discarded.append(result))
    runner.run(Request("perf", "screen-r1-c1", "c1"))
    runner.run(Request("perf", "screen-r2-c1", "c1", check=False))
    assert checked == ["screen-r1-c1"] and len(discarded) == 2


# --- what a screen can rank within the time given ----------------------------------------------------


def test_the_first_ranking_costs_every_correctness_run_and_one_round_with_its_reference_checks():
    from cutile_perf.loop import budget

    cost = budget.ScreenCost(correctness_s=12.0, perf_s=18.0, reference_s=9.0)
    # 8 candidates: 8 correctness runs, the base and 8 timed runs, 8 reference checks.
    assert cost.first_ranking_s(8) == 8 * 12 + 9 * 18 + 8 * 9
    # Over 2 workers each times the base and its 4 candidates, side by side.
    assert cost.first_ranking_s(8, workers=2) == 8 * 12 + 5 * 18 + 4 * 9
    assert cost.fitting(8, seconds=cost.first_ranking_s(3)) == 3
    assert cost.fitting(8, seconds=cost.first_ranking_s(3) - 1) == 2
    assert cost.fitting(8, seconds=10_000) == 8 and cost.fitting(8, seconds=0) == 1  # at least one


def test_the_screen_cost_comes_from_the_logs_stage_times():
    from cutile_perf.loop import budget

    baseline = {"iteration": 0, "timings": {"stages": [["0-correctness", 12.0], ["0-perf", 18.0], ["0-perf", 20.0]]}}
    assert budget.screen_cost([]) is None
    before_any_try = budget.screen_cost([baseline])
    assert (before_any_try.correctness_s, before_any_try.perf_s) == (12.0, 20.0)  # the slower run
    assert before_any_try.reference_s == 20.0, "no reference check timed yet: priced as a perf run"
    tried = {"iteration": 1, "status": "keep", "timings": {"stages": [["1-correctness", 13.0], ["1-perf", 19.0],
                                                                     ["1-reference", 9.0]]}}
    assert budget.screen_cost([baseline, tried]).reference_s == 9.0


def test_spread_cases_takes_both_ends_and_the_middle_of_the_base_latencies():
    from cutile_perf.loop.screen_rank import spread_cases

    medians = {"a": 5.0, "b": 1.0, "c": 3.0, "d": 2.0, "e": 4.0}  # by latency: b d c e a
    assert spread_cases(medians, None) == ["a", "b", "c", "d", "e"]
    assert spread_cases(medians, 5) == spread_cases(medians, 9) == ["a", "b", "c", "d", "e"]
    assert spread_cases(medians, 1) == ["c"]  # the middle one
    assert spread_cases(medians, 2) == ["a", "b"]  # the fastest and the slowest
    assert spread_cases(medians, 3) == ["a", "b", "c"]
    assert len(spread_cases(medians, 4)) == 4 and {"a", "b"} <= set(spread_cases(medians, 4))
    # Equal latencies: ordered by name, so the same log always gives the same cases.
    assert spread_cases({"y": 1.0, "x": 1.0, "z": 1.0}, 1) == ["y"]
    for n in range(1, 12):  # never a case twice, never more than asked
        picked = spread_cases({f"c{i:02d}": float(i % 7) for i in range(11)}, n)
        assert len(picked) == len(set(picked)) == min(n, 11)
