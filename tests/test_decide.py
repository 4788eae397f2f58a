"""Keep/revert/confirm/stop rules, table-driven, plus a few fixed-seed sessions of the simulated repo.

The Monte-Carlo rates (power, A/A, ratchet) are ``benchmarks/decision_power.py``'s; the tests here run
a handful of its sessions with exact outcomes, so a broken rule fails them in seconds.
"""
from __future__ import annotations

import math
import random

import pytest

from cutile_perf.judge.rules import (Thresholds, case_noise, cases_in_doubt, combine_latency, decide,
                                     geomean_zone, moved_performance, next_priority_hint, noise_floor, recheck_bound,
                                     single_run_gate, stop_condition)
from cutile_perf.judge.paired import confirm, slower_threshold
from cutile_perf.judge import paired as paired_module
from cutile_perf.judge.stats import median

T = Thresholds()
BASE = {"262144-1024": 0.2799, "262144-2048": 0.55, "65536-8192": 0.41}
QUIET = {s: 0.005 for s in BASE}  # 0.5 % noise: gate 0.75 %, borderline up to 1.5 %


def scaled(factors: dict[str, float] | float) -> dict[str, float]:
    if isinstance(factors, float):
        factors = {s: factors for s in BASE}
    return {s: BASE[s] * factors.get(s, 1.0) for s in BASE}


# --- thresholds ---------------------------------------------------------------------------------


def test_thresholds_defaults_are_the_seed_rules_and_round_trip():
    assert (T.new_baseline, T.keep, T.patience, T.max_iterations) == (0.05, 0.02, 2, 25)
    assert Thresholds.from_dict(T.to_dict()) == T
    assert Thresholds.from_dict({"noise_k": 2.0}).noise_k == 2.0
    assert Thresholds.from_dict(None) == T


@pytest.mark.parametrize("data, message", [
    ({"noise": 1}, "unknown threshold"), ({"keep": -0.1}, "must be a finite number >= 0"),
    ({"keep": 0.1}, "must not exceed new_baseline"), ({"patience": 0}, ">= 1"), ({"confidence": 1.5}, "between"),
])
def test_thresholds_reject_bad_values(data, message):
    with pytest.raises(ValueError, match=message):
        Thresholds.from_dict(data)


def test_thresholds_are_frozen():
    with pytest.raises(AttributeError):
        T.keep = 0.5  # type: ignore[misc]


# --- measurements -------------------------------------------------------------------------------


def test_combine_latency_is_the_geomean_of_shape_medians():
    assert combine_latency({"a": 1.0, "b": 4.0}) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        combine_latency({})


def test_noise_floor_widens_few_runs_pools_across_shapes_and_has_a_minimum():
    runs = {"a": [1.0, 1.01, 1.02], "b": [2.0, 2.0, 2.0], "c": [1.0, 1.02], "d": [5.0]}
    floor = noise_floor(runs)
    assert floor["a"] == pytest.approx(0.02 / 1.01 * 2)  # spread x (n+1)/(n-1)
    assert floor["c"] == pytest.approx(0.02 / 1.01 * 3)
    # b agreed perfectly by luck; it is not trusted to be quieter than the typical shape.
    typical = median([floor["a"], 0.0, floor["c"], 0.02])  # d, measured once, is assumed 2 %
    assert floor["b"] == floor["d"] == pytest.approx(typical)
    assert noise_floor({"x": [1.0, 1.0, 1.0]}) == {"x": 0.005}
    assert noise_floor({}) == {}


# --- decide: one candidate run --------------------------------------------------------------------

DECIDE_TABLE = [
    # (name, candidate, noise, verdict, tier, rebaseline)
    ("identical", scaled(1.0), QUIET, "keep", "no-change", False),
    ("0.5 % faster is noise", scaled(0.995), QUIET, "keep", "no-change", False),
    ("8 % faster", scaled(0.92), QUIET, "keep", "new-baseline", True),
    ("3 % faster", scaled(0.97), QUIET, "keep", "keep-lower-priority", True),
    ("1.2 % faster is borderline", scaled(0.988), QUIET, "confirm", "borderline", False),
    ("2.5 % faster, 1 % noise: borderline", scaled(0.975), {s: 0.01 for s in BASE}, "confirm", "borderline", False),
    ("one shape 3 % slower reverts", scaled({"65536-8192": 1.03}), QUIET, "revert", "regression", False),
    ("20 % faster but one shape 3 % slower", scaled({"262144-1024": 0.8, "262144-2048": 0.8, "65536-8192": 1.03}),
     QUIET, "revert", "regression", False),
    ("one shape 1 % slower: borderline", scaled({"65536-8192": 1.01}), QUIET, "confirm", "borderline", False),
    # Inside the gate but more than recheck_fraction of it: not waved through, re-measured (the ratchet).
    ("one shape 3 % slower in 4 % noise is re-measured", scaled({"65536-8192": 1.03}), {s: 0.04 for s in BASE},
     "confirm", "borderline", False),
    # Every case is checked against its own re-check bound, not only the one nearest its gate: here the
    # quiet 262144-1024 (0.5 % faster, gate 0.75 %) is nearest, the noisy 65536-8192 rose 2 % of its 6 %.
    ("a noisy case's rise is re-measured though a quiet case is nearer its gate",
     scaled({"262144-1024": 0.995, "65536-8192": 1.02}), {**QUIET, "65536-8192": 0.04}, "confirm", "borderline", False),
    ("all 0.6 % slower: re-measured", scaled(1.006), QUIET, "confirm", "borderline", False),
    ("all 0.1 % slower: within noise", scaled(1.001), QUIET, "keep", "no-change", False),
    ("missing shape", {"262144-1024": 0.2, "262144-2048": 0.5}, QUIET, "revert", "missing-shape", False),
]


@pytest.mark.parametrize("name, candidate, noise, verdict, tier, rebaseline", DECIDE_TABLE, ids=[r[0] for r in DECIDE_TABLE])
def test_decide_table(name, candidate, noise, verdict, tier, rebaseline):
    d = decide(BASE, candidate, noise, T)
    assert (d.verdict, d.tier, d.rebaseline) == (verdict, tier, rebaseline), d.reason
    assert "\n" not in d.reason


# --- cases_in_doubt: what the interleaved re-check re-measures --------------------------------------

DOUBT_TABLE = [
    # (name, candidate, noise, implausible, cases in doubt)
    ("one case risen past its re-check bound: that case alone", scaled({"65536-8192": 1.01}), QUIET, (),
     ("65536-8192",)),
    ("two risen, one quiet", scaled({"65536-8192": 1.004, "262144-1024": 1.01, "262144-2048": 0.996}), QUIET, (),
     ("262144-1024", "65536-8192")),
    ("a noisy case's rise beside a quiet case's", scaled({"262144-1024": 0.995, "65536-8192": 1.02}),
     {**QUIET, "65536-8192": 0.04}, (), ("65536-8192",)),
    ("clearly faster overall, one case risen", scaled({"262144-1024": 0.8, "262144-2048": 0.8, "65536-8192": 1.005}),
     QUIET, (), ("65536-8192",)),
    ("a claim beyond the plausibility factor", scaled({"262144-1024": 0.2, "262144-2048": 0.9}), QUIET,
     ("262144-1024",), ("262144-1024",)),
    ("the geomean borderline faster: every case", scaled(0.988), QUIET, (), tuple(sorted(BASE))),
    ("the geomean borderline slower: every case", scaled(1.006), QUIET, (), tuple(sorted(BASE))),
    ("nothing in doubt: every case", scaled(1.0), QUIET, (), tuple(sorted(BASE))),
]


@pytest.mark.parametrize("name, candidate, noise, implausible, doubt", DOUBT_TABLE, ids=[r[0] for r in DOUBT_TABLE])
def test_cases_in_doubt_table(name, candidate, noise, implausible, doubt):
    assert cases_in_doubt(BASE, candidate, noise, T, implausible) == doubt


def test_every_case_left_out_of_the_re_check_passes_the_single_run_rule_outright():
    """The derivation in ``cases_in_doubt``: a case the re-check leaves out rose no more than its
    re-check bound, which is what a single run that is kept without any re-check asks of every case;
    and the run's geomean sits outside the borderline band (no-change or clearly faster)."""
    rng = random.Random(20261207)
    partial = 0
    for _ in range(3000):
        noise = {s: rng.choice([0.005, 0.01, 0.03]) for s in BASE}
        candidate = {s: v * (1 + rng.uniform(-0.05, 0.03)) for s, v in BASE.items()}
        if decide(BASE, candidate, noise, T).verdict != "confirm":
            continue
        doubt = cases_in_doubt(BASE, candidate, noise, T)
        if len(doubt) == len(BASE):
            continue
        partial += 1
        for case in set(BASE) - set(doubt):
            gate = single_run_gate(case_noise(noise, case, T), T)
            assert candidate[case] / BASE[case] - 1 <= recheck_bound(gate, T)
        zone, _, _ = geomean_zone({s: candidate[s] / BASE[s] for s in BASE}, noise, T)
        assert zone in ("no-change", "faster")
    assert partial > 100  # the partial re-check is the common case here, not a corner


def test_regression_reason_names_the_worst_shape_and_its_change():
    d = decide(BASE, scaled({"65536-8192": 1.031, "262144-1024": 1.025}), QUIET, T)
    assert d.worst_shape == "65536-8192"
    assert d.reason.startswith("shape 65536-8192 +3.1 % vs baseline (gate 0.8 %)")
    assert d.changes["65536-8192"] == pytest.approx(0.031)
    assert d.to_dict()["verdict"] == "revert"


def test_regression_tolerance_allows_small_slowdowns():
    lenient = Thresholds(regression_tolerance=0.03)
    d = decide(BASE, scaled({"65536-8192": 1.02, "262144-1024": 0.9, "262144-2048": 0.9}), QUIET, lenient)
    assert (d.verdict, d.tier) == ("keep", "new-baseline")  # geomean -6.0 %


def test_shapes_only_in_the_candidate_are_ignored():
    d = decide(BASE, {**scaled(0.9), "new-shape": 9.0}, QUIET, T)
    assert d.tier == "new-baseline" and "new-shape" not in d.changes


# --- confirm: interleaved paired samples -----------------------------------------------------------


def paired(factor: dict[str, float] | float, *, spread=0.004, rounds=5, seed=0):
    rng = random.Random(seed)
    factors = factor if isinstance(factor, dict) else {s: factor for s in BASE}
    noisy = lambda v: v * (1 + rng.uniform(-spread, spread))  # noqa: E731
    return {s: ([noisy(BASE[s]) for _ in range(rounds)], [noisy(BASE[s] * factors.get(s, 1.0)) for _ in range(rounds)])
            for s in BASE}


CONFIRM_TABLE = [
    ("same code", 1.0, "keep", "no-change", False),
    ("1.5 % faster, 0.4 % noise", 0.985, "keep", "keep-recommend-stop", True),
    ("3 % faster", 0.97, "keep", "keep-lower-priority", True),
    ("one shape 1.5 % slower", {"65536-8192": 1.015}, "revert", "regression", False),
]


@pytest.mark.parametrize("name, factor, verdict, tier, rebaseline", CONFIRM_TABLE, ids=[r[0] for r in CONFIRM_TABLE])
def test_confirm_table(name, factor, verdict, tier, rebaseline):
    d = confirm(paired(factor), T)
    assert (d.verdict, d.tier, d.rebaseline, d.source) == (verdict, tier, rebaseline, "confirm"), d.reason
    assert d.verdict != "confirm"


def test_confirm_needs_enough_samples():
    with pytest.raises(ValueError, match=">= 3 samples"):
        confirm({"a": ([1.0, 1.0], [1.0, 1.0, 1.0])}, T)
    with pytest.raises(ValueError):
        confirm({}, T)


# --- A/A: the same code measured again is rarely kept as faster or reverted as slower --------------


def _unchanged_tries(t: Thresholds, tries: int = 8, cases: int = 3) -> list[tuple[str, bool, int]]:
    """Unchanged code tried ``tries`` times, each case its own latency and per-run jitter (1-3 %),
    as the mixed A/A rows of benchmarks/decision_power.py run it (4 x 1000 tries there):
    (action, baseline moved, extra perf runs) per try."""
    power = _load_benchmark("decision_power")
    rng, out = random.Random(20260818), []
    for _ in range(tries):
        latency = {f"case{i:02d}": rng.uniform(0.005, 5.0) for i in range(cases)}
        noise = {c: rng.uniform(0.01, 0.03) for c in latency}
        verdict, runs, _ = power.aa_try(power.Simulator(noise, 0.0, rng, samples=1), latency, 3, t)
        out.append((verdict.action, bool(verdict.decision and verdict.decision.rebaseline), runs))
    return out


def test_unchanged_code_with_its_own_jitter_per_case_is_kept_without_moving_the_baseline():
    # Issue 9's A/A bound (at most 1 % false keeps or reverts) is measured by the benchmark's mixed
    # A/A rows; here a handful of fixed-seed tries, each outcome exact: kept, nothing moved, and
    # the re-check asked for where a run came out borderline.
    assert _unchanged_tries(T) == [("keep", False, 0), ("keep", False, 2), ("keep", False, 0), ("keep", False, 0),
                                   ("keep", False, 0), ("keep", False, 6), ("keep", False, 4), ("keep", False, 0)]
    # The same tries with no allowance for noise are all reverted: the test sees a broken gate.
    loose = Thresholds(noise_k=0.0, min_noise=0.0)
    assert [action for action, _, _ in _unchanged_tries(loose)] == ["revert"] * 8


def test_slower_threshold_rises_with_the_number_of_cases_tested():
    # Bonferroni on the one-sided normal level of slower_z (2.75): the same false-revert rate for an
    # unchanged kernel, however many cases it has.
    assert [round(slower_threshold(T, n), 2) for n in (1, 3, 10)] == [2.75, 3.09, 3.43]


def test_a_gate_crossed_by_luck_is_not_a_revert_without_a_paired_rise():
    # The three interleaved baseline samples agreed closely (gate 0.5 %) and the candidate sits 1 %
    # above them, but the baseline's own repeated runs varied by 4 %: the paired test sees no real
    # rise, so the tiny gate alone does not revert.
    paired = {"a": ([1.000, 1.001, 1.002], [1.012, 1.010, 1.011])}
    prior_runs = {"a": [0.98, 1.0, 1.02]}
    d = confirm(paired, T, prior_runs)
    assert d.verdict == "keep", d.reason
    assert d.paired_z["a"] < paired_module.SOME_RISE_Z
    # The same samples without that evidence of noise are a revert.
    assert confirm(paired, T).verdict == "revert"


def _slowdown_sessions(t: Thresholds, sessions: int = 6) -> list[tuple[str, int]]:
    """A real +4 % on one of three cases, 3 % per-sample noise, as benchmarks/decision_power.py's
    slowdown row runs it (300 sessions there, goal: >= 90 % reverted, <= 6 extra perf runs):
    (action, extra perf runs) per session."""
    power = _load_benchmark("decision_power")
    rng, out = random.Random(20261201), []
    for _ in range(sessions):
        sim = power.Simulator(0.03, 0.0, rng)
        ref = power.baseline(sim, power.TRUE_MS, 3, t)
        slower = {**power.TRUE_MS, power.CASES[0]: power.TRUE_MS[power.CASES[0]] * 1.04}
        verdict, runs, _ = power.one_try(sim, ref, power.TRUE_MS, slower, t)
        out.append((verdict.action, runs))
    return out


def test_a_4_percent_slowdown_on_one_case_is_reverted_after_its_re_check_in_each_session():
    assert _slowdown_sessions(T) == [("revert", 6)] * 6
    # Without the re-check (no borderline band, no re-check bound) two of the six slip through.
    no_recheck = Thresholds(confirm_band=0, recheck_fraction=1.0)
    assert _slowdown_sessions(no_recheck) == [("keep", 0), ("revert", 0), ("revert", 0), ("revert", 0), ("keep", 0),
                                              ("revert", 0)]


def _load_benchmark(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- stop rules ---------------------------------------------------------------------------------


def entry(iteration: int, status: str = "keep", tier: str | None = None, change: float | None = None, **extra) -> dict:
    decision = None if tier is None else {"tier": tier, "geomean_change": change}
    return {"iteration": iteration, "status": status, "decision": decision, **extra}


BASELINE = entry(0)
STOP_TABLE = [
    ("baseline only", [BASELINE], None),
    ("one improvement", [BASELINE, entry(1, tier="new-baseline", change=-0.1)], None),
    ("one revert", [BASELINE, entry(1, "revert", "regression", 0.03)], None),
    ("two reverts", [BASELINE, entry(1, "revert", "regression"), entry(2, "crash")], "2 iterations in a row"),
    ("revert, gain, revert", [BASELINE, entry(1, "revert", "regression"), entry(2, tier="new-baseline", change=-0.1),
                              entry(3, "revert", "regression")], None),
    ("small gain", [BASELINE, entry(1, tier="keep-recommend-stop", change=-0.012)], "gained 1.2 % (< 2 %)"),
    ("no-change keep", [BASELINE, entry(1, tier="no-change", change=0.001)], "recommend stop: the last kept "
     "change changed +0.1 %, within noise"),
    ("iteration 25", [BASELINE, entry(25, tier="new-baseline", change=-0.1)], "limit of 25 iterations"),
    # A live swiglu trial's batch job: a gain within noise, then a try cut by the job's end. The cut
    # try said nothing, so only one try in a row lacks an improvement: the small keep's advice stands.
    ("within noise, then cut", [BASELINE, entry(1, tier="new-baseline", change=-0.33),
                                entry(2, tier="no-change", change=-0.04),
                                entry(3, "crash", crash_class="interrupted")], "changed -4.0 %, within noise"),
    ("revert, then cut", [BASELINE, entry(1, "revert", "regression"), entry(2, "crash", crash_class="interrupted")],
     None),
    ("revert, cut, revert", [BASELINE, entry(1, "revert", "regression"), entry(2, "crash", crash_class="interrupted"),
                             entry(3, "revert", "regression")], "2 iterations in a row"),
    ("cut at iteration 25", [BASELINE, entry(25, "crash", crash_class="interrupted")], "limit of 25 iterations"),
]


@pytest.mark.parametrize("name, history, expected", STOP_TABLE, ids=[r[0] for r in STOP_TABLE])
def test_stop_condition_table(name, history, expected):
    reason = stop_condition(history, T)
    if expected is None:
        assert reason is None
    else:
        assert expected in reason and "\n" not in reason


def test_improved_and_priority_hint():
    assert moved_performance(entry(1, tier="keep-lower-priority"))
    assert not moved_performance(entry(1, tier="no-change")) and not moved_performance(entry(1, "revert", "new-baseline"))
    assert next_priority_hint([BASELINE]) is None
    assert "lower-priority" in next_priority_hint([BASELINE, entry(1, tier="keep-lower-priority")])
    assert "crashed (compile)" in next_priority_hint([BASELINE, entry(1, "crash", crash_class="compile")])
    cut = next_priority_hint([BASELINE, entry(1, "crash", crash_class="interrupted")])
    assert "stopped before its verdict" in cut and "crashed" not in cut


def test_ratchet_at_the_red_team_tests_noise_never_drifts_past_a_cases_gate():
    """Six +4 % steps with 12 % per-sample jitter (tests/test_redteam.py's ratchet), four fixed-seed
    sessions: how many steps each kept, exactly, and never beyond the case's gate. The rate over
    300 sessions is the benchmark's (``python benchmarks/decision_power.py --only issue9 --noise 0.12
    --steps 6``; references/harness.md quotes it)."""
    power = _load_benchmark("decision_power")
    results = power.ratchet_drifts(4, 6, 0.12, 0.0, 0.04, 3, Thresholds(), random.Random(20261201))
    steps_kept = [round(math.log1p(drift) / math.log1p(0.04)) for drift, _gate in results]
    assert steps_kept == [3, 2, 1, 2]
    assert all(drift <= gate for drift, gate in results)
    # Without the re-check the kept code ends beyond the gate in one of the same sessions.
    loose = power.ratchet_drifts(4, 6, 0.12, 0.0, 0.04, 3, Thresholds(confirm_band=0, recheck_fraction=1.0),
                                 random.Random(20261201))
    assert sum(drift > gate for drift, gate in loose) == 1


def test_decision_power_prices_a_loosened_threshold_and_refuses_one_that_does_not_exist(capsys):
    """``--threshold`` runs the same simulation with a threshold set away from its default (what
    references/harness.md quotes for the re-check): without any re-check, a real +4 % slowdown on
    one of three cases slips through, which the script reports as a missed goal."""
    power = _load_benchmark("decision_power")
    code = power.main(["--threshold", "confirm_band=0", "--threshold", "recheck_fraction=1.0", "--only", "issue9",
                       "--sessions", "6", "--tries", "4", "--steps", "2", "--wide", "0", "--seed", "1"])
    out = capsys.readouterr().out
    assert "except confirm_band=0, recheck_fraction=1.0" in out
    slowdown = next(line for line in out.splitlines() if line.startswith("| +4 % on 1 of 3 cases"))
    assert slowdown.endswith("| MISSED |") and code == 1
    assert "| gain:" not in out  # --only issue9 leaves issue 39's rows out
    with pytest.raises(SystemExit) as exc:
        power.main(["--threshold", "no_such_threshold=1"])
    assert exc.value.code == 2 and "unknown threshold" in capsys.readouterr().err


# --- the re-check settled before its last pairs -------------------------------------------------


def test_completed_fills_every_case_up_to_the_pairs_around_its_mean_so_far():
    paired = {"a": ([1.0, 1.02], [1.10, 1.12]), "b": ([2.0], [2.0])}
    middle = paired_module.completed(paired, None, 0.005, 3, 0.0)
    assert middle["a"][0][:2] == [1.0, 1.02] and middle["a"][1][:2] == [1.10, 1.12]  # the real runs stay first
    assert [len(side) for case in middle.values() for side in case] == [3, 3, 3, 3]
    centre = (1.0 * 1.02) ** 0.5
    mean = ((1.10 / 1.0) * (1.12 / 1.02)) ** 0.5  # the geometric mean of the per-pair ratios
    assert middle["a"][0][2] == pytest.approx(centre) and middle["a"][1][2] == pytest.approx(centre * mean)
    slower = paired_module.completed(paired, None, 0.005, 3, 2.0)
    faster = paired_module.completed(paired, None, 0.005, 3, -2.0)
    assert faster["a"][1][2] < middle["a"][1][2] < slower["a"][1][2]
    assert faster["b"][1][1:] == faster["b"][1][2:] * 2 and faster["b"][1][1] < 2.0  # both runs to come alike
    wide = paired_module.completed(paired, None, 0.005, 3, 0.0, base_sd=2.0)
    assert wide["b"][0][1] > 2.0 > wide["b"][0][2]  # one above the centre, one below: spread added
    assert paired_module.completed(paired, None, 0.005, 2, 1.0)["a"] == paired["a"]  # already complete
    with pytest.raises(ValueError, match="at least one pair"):
        paired_module.completed({"a": ([], [])}, None, 0.005, 3, 0.0)


def _borderline_then(pairs: list[tuple[float, float]], t: Thresholds = T):
    """The judge's verdict on a case whose single run was borderline (+2.5 % against 1 % noise),
    after interleaved (baseline, candidate) pairs of its runs."""
    from cutile_perf.judge.verdict import Evidence, Reference, Stage, judge
    runs = {"a": [0.995, 1.0, 1.005], "b": [1.99, 2.0, 2.01]}
    ref = Reference("base", {"a": 1.0, "b": 2.0}, noise_floor(runs), runs=runs)
    evidence = Evidence(perf=Stage("perf", shapes={"a": 1.025, "b": 2.0}))
    assert judge(ref, t, evidence).action == "re-measure"
    made = tuple((Stage("perf", shapes={"a": b, "b": 2.0}), Stage("perf", shapes={"a": c, "b": 2.0}))
                 for b, c in pairs)
    return judge(ref, t, evidence.add(pairs=made))


def test_a_re_check_whose_first_pair_leaves_no_doubt_stops_there():
    verdict = _borderline_then([(1.0, 1.30)])  # 30 % slower in its first pair, against 1 % noise
    assert verdict.action == "revert" and verdict.decision.settled_after == 1
    assert "settled after 1 of 3 interleaved pairs" in verdict.reason
    # 20 % faster, after a single run that said so too, does not settle: a keep that moves the
    # baseline rests on every pair (a candidate fast in 30 % of its processes shows it only there).
    clear_gain = _judge_runs(0.80, [(1.0, 0.80)])
    assert clear_gain.action == "re-measure"
    assert "not settled early: a keep that moves the baseline rests on every pair" in clear_gain.reason
    kept = _judge_runs(0.80, [(1.0, 0.80), (1.001, 0.801), (0.999, 0.799)])
    assert (kept.action, kept.decision.rebaseline, kept.decision.settled_after) == ("keep", True, None)
    # settle_sd 0 runs every pair, as before.
    assert _borderline_then([(1.0, 1.30)], Thresholds(settle_sd=0.0)).action == "re-measure"


def test_a_settled_verdict_quotes_the_pairs_that_ran_never_the_filled_in_ones():
    """The filled-in pairs (``completed``) only test whether the verdict could still change; quoted,
    their z and intervals would claim the certainty of three pairs from one."""
    runs = {"a": [0.995, 1.0, 1.005], "b": [1.99, 2.0, 2.01]}
    slower = _borderline_then([(1.0, 1.30)])
    real = paired_module.paired_log_ratios({"a": ([1.0], [1.30])}, runs, T.min_noise)["a"]
    filled = paired_module.paired_log_ratios(paired_module.completed({"a": ([1.0], [1.30])}, runs, T.min_noise, 3, 0.0),
                                             runs, T.min_noise)["a"]
    assert filled.z > real.z * 1.5  # what the reason said before: three pairs' worth of evidence
    assert slower.decision.paired_z["a"] == pytest.approx(real.z)
    assert slower.decision.changes == pytest.approx({"a": 0.30, "b": 0.0})
    assert slower.decision.geomean_change == pytest.approx(1.30 ** 0.5 - 1.0)
    assert f"a +30.0 %, z = {real.z:.1f}" in slower.reason and "interval" not in slower.reason
    assert slower.reason.startswith("slower (a): reverted, settled after 1 of 3 interleaved pairs")
    assert slower.decision.reason == slower.reason


def test_a_re_check_still_in_doubt_runs_on_and_its_last_pair_decides_as_before():
    close = _borderline_then([(1.0, 1.012)])  # about the gate: the pairs to come could go either way
    assert close.action == "re-measure"
    close = _borderline_then([(1.0, 1.012), (1.002, 1.013)])
    assert close.action == "re-measure"
    done = _borderline_then([(1.0, 1.012), (1.002, 1.013), (0.999, 1.011)])
    assert done.final and done.decision.settled_after is None
    assert done == _borderline_then([(1.0, 1.012), (1.002, 1.013), (0.999, 1.011)], Thresholds(settle_sd=0.0))


# --- issue 39: evidence a busy machine or a lucky run can shape ---------------------------------

RUNS2 = {"a": [0.995, 1.0, 1.005], "b": [1.99, 2.0, 2.01]}


def _ref2():
    from cutile_perf.judge.verdict import Reference
    return Reference("base", {"a": 1.0, "b": 2.0}, noise_floor(RUNS2), runs=RUNS2)


def _judge_runs(single: float, pairs: list[tuple[float, float]], t: Thresholds = T, **evidence):
    """The judge's verdict on a candidate whose single run and interleaved (baseline, candidate)
    pairs scale every case of ``_ref2`` alike by the factors given."""
    from cutile_perf.judge.verdict import Evidence, Stage, judge
    shapes = lambda f: {"a": 1.0 * f, "b": 2.0 * f}  # noqa: E731
    made = tuple((Stage("perf", shapes=shapes(b)), Stage("perf", shapes=shapes(c))) for b, c in pairs)
    return judge(_ref2(), t, Evidence(perf=Stage("perf", shapes=shapes(single)), pairs=made, **evidence))


def test_a_baseline_run_that_the_single_run_rule_would_call_changed_disagrees_with_the_recorded_medians():
    from cutile_perf.judge.rules import baseline_disagreement
    recorded, noise = {"a": 1.0, "b": 2.0}, noise_floor(RUNS2)
    assert baseline_disagreement(recorded, noise, {"a": 1.004, "b": 1.995}, T) is None  # inside its noise
    slow = baseline_disagreement(recorded, noise, {"a": 1.5, "b": 3.0}, T)  # a co-tenant: every case 50 % slow
    assert slow.startswith("the baseline commit measured geomean +50.0 % against its recorded medians")
    assert "geomean -30.0 %" in baseline_disagreement(recorded, noise, {"a": 0.7, "b": 1.4}, T)  # recorded under load
    one_case = baseline_disagreement(recorded, noise, {"a": 0.97, "b": 2.14}, T)  # one case far off, geomean not
    assert one_case.startswith("the baseline commit measured case b +7.0 %")
    assert baseline_disagreement(recorded, noise, {"a": 1.5}, T) is not None  # a run of the cases in doubt only
    assert baseline_disagreement(recorded, noise, {}, T) is None


def test_a_slow_baseline_run_of_the_re_check_is_left_out_and_a_drifting_baseline_is_refused():
    # Issue 39: an honestly ~1 % slower change, one baseline run of the re-check slowed by a
    # co-tenant, was "keep/new-baseline -36.9 %, settled after 1 of 3 pairs".
    from cutile_perf.judge.verdict import last_pair
    verdict = _judge_runs(1.025, [(1.6, 1.01)])
    assert verdict.action == "re-measure", verdict.reason
    assert "pair 1's baseline run left out: the baseline commit measured geomean +60.0 %" in verdict.reason
    # The pairs in its place decide, and the row says which pair was left out.
    done = _judge_runs(1.025, [(1.6, 1.01), (1.0, 1.01), (1.001, 1.012), (0.999, 1.009)])
    assert done.final and "pair 1's baseline run left out" in done.reason
    assert not (done.action == "keep" and done.decision.rebaseline)
    # A baseline that runs at another speed in every pair (a leftover, or a baseline recorded under
    # load) is never kept against: past last_pair the change is refused.
    drifting = [(1.6, 1.01)] * last_pair(T)
    assert _judge_runs(1.025, drifting[:-1]).action == "re-measure"
    refused = _judge_runs(1.025, drifting)
    assert (refused.action, refused.decision.tier) == ("revert", "baseline-drift")
    assert refused.reason.startswith(f"baseline-drift: {last_pair(T)} of {last_pair(T)} interleaved pairs' baseline "
                                     "runs disagreed")


def test_a_keep_that_moves_the_baseline_never_rests_on_one_candidate_run():
    # A comment-only change kept at -36.6 % against a baseline recorded under load (issue 39): one
    # candidate process says nothing about the candidate's own spread.
    lucky = _judge_runs(0.7, [])
    assert lucky.action == "re-measure" and "rests on more than one candidate run" in lucky.reason
    assert lucky.decision.rebaseline  # what the single run alone would have done
    assert _judge_runs(1.0, []).action == "keep"  # a within-noise keep moves nothing: no re-check
    # Its pairs show the change is none: kept without moving the baseline. The single run that
    # disagrees with them is no revert (an unchanged candidate's lucky run: A/A false reverts).
    same = _judge_runs(0.7, [(1.0, 1.0), (1.002, 1.001), (0.998, 0.999)])
    assert (same.action, same.decision.tier, same.decision.rebaseline) == ("keep", "no-change", False), same.reason


def test_candidate_spread_flags_runs_that_disagree_beyond_the_baseline_noise():
    from cutile_perf.judge.paired import candidate_spread, paired_log_ratios
    alike = paired_log_ratios({"a": ([1.0, 1.002, 0.998], [0.9, 0.903, 0.899])}, RUNS2, T.min_noise)
    assert candidate_spread(alike) is None
    bimodal = paired_log_ratios({"a": ([1.0, 1.002, 0.998], [0.7, 1.06, 1.061])}, RUNS2, T.min_noise)
    why = candidate_spread(bimodal)
    assert why.startswith("the candidate's runs of case a disagree: -30.0 % to +6.3 % against the baseline")
    one_pair = paired_log_ratios({"a": ([1.0], [0.9])}, RUNS2, T.min_noise)
    assert candidate_spread(one_pair) is None  # one value: nothing to compare


def test_a_bimodal_candidate_is_not_settled_by_one_fast_pair():
    # A candidate ~+1 % in its single run (borderline), fast in the one process of the first pair:
    # settled as "faster" after that pair before; its runs disagree, so the pairs go on.
    verdict = _judge_runs(1.025, [(1.0, 0.7)])
    assert verdict.action == "re-measure" and "not settled early: the candidate's single run" in verdict.reason
    # Nor does the same pair after a single run that agrees with it: two fast processes of four.
    assert _judge_runs(0.72, [(1.0, 0.7)]).action == "re-measure"
    # All its pairs run: fast in one of three processes, it is reverted as unstable, never kept.
    done = _judge_runs(1.025, [(1.0, 0.7), (1.0, 1.06), (1.0, 1.061)])
    assert (done.action, done.decision.tier, done.decision.rebaseline) == ("revert", "unstable", False), done.reason


def test_one_fast_pair_does_not_keep_a_slower_candidate_within_noise():
    # Issue 39's drifting candidate with every pair run: +6 % in two of three pairs, -30 % in one;
    # the fast pair flipped the mean's sign, so "within noise" kept it at +6 %.
    from cutile_perf.judge.paired import paired_log_ratios
    pairs = [(1.0, 0.7), (1.0, 1.06), (1.001, 1.061)]
    tests = paired_log_ratios({"a": ([b for b, _ in pairs], [c for _, c in pairs])}, RUNS2, T.min_noise)
    assert tests["a"].z < 0 < paired_module.SOME_RISE_Z < tests["a"].robust_z
    verdict = _judge_runs(1.0, pairs, Thresholds(settle_sd=0.0), repeat_of=1)
    assert (verdict.action, verdict.decision.tier) == ("revert", "unstable"), verdict.reason
    assert "-30.0 % to +6.0 % against the baseline" in verdict.reason


def test_a_candidate_whose_runs_disagree_is_reverted_even_within_a_wide_gate():
    # The benchmark's bimodal row: +7 % in two pairs, -23 % in one, against a baseline whose noise
    # gives a 9 % gate. The median sits inside the gate and the mean says faster, so "within
    # noise" kept it before (12 of 100 sessions).
    from cutile_perf.judge.verdict import Evidence, Reference, Stage, judge
    runs = {"a": [0.985, 1.0, 1.015], "b": [1.97, 2.0, 2.03]}
    ref = Reference("base", {"a": 1.0, "b": 2.0}, noise_floor(runs), runs=runs)
    shapes = lambda f: {"a": 1.0 * f, "b": 2.0 * f}  # noqa: E731
    pairs = tuple((Stage("perf", shapes=shapes(b)), Stage("perf", shapes=shapes(c)))
                  for b, c in [(1.0, 0.77), (1.0, 1.07), (1.0, 1.072)])
    verdict = judge(ref, T, Evidence(perf=Stage("perf", shapes=shapes(1.07)), pairs=pairs))
    assert (verdict.action, verdict.decision.tier) == ("revert", "unstable"), verdict.reason
    assert verdict.reason.startswith("unstable: the candidate's runs of case a disagree: -23.0 % to +7.2 %")


def test_what_reverted_content_measured_before_is_evidence_of_its_spread():
    # A repeat whose runs now all come out fast (23 %) after a try that measured it +10 %: kept as
    # faster on its whole re-check before; the earlier slow runs disagree with these.
    fast = [(1.0, 0.77), (1.001, 0.771), (0.999, 0.769)]
    assert _judge_runs(0.77, fast, repeat_of=4).decision.rebaseline  # told nothing of before
    before = {"a": (1.10, 1.102), "b": (1.099,)}
    verdict = _judge_runs(0.77, fast, repeat_of=4, prior_ratios=before)
    assert (verdict.action, verdict.decision.tier) == ("revert", "unstable"), verdict.reason
    assert "case a measured +10.0 % when this content was reverted (iteration 4) and -23.0 % now" in verdict.reason
    # Runs that agree with what it measured before are no such evidence: a slower repeat is judged as before.
    alike = _judge_runs(1.0, [(1.0, 1.0), (1.001, 1.0), (0.999, 1.001)], repeat_of=4,
                        prior_ratios={"a": (1.002,), "b": (0.999,)})
    assert (alike.action, alike.decision.rebaseline) == ("keep", False), alike.reason


def test_a_drifting_implausible_claim_is_judged_on_every_pair():
    # Fast only in its first two processes (the try's run and the first pair): kept at -70 % after
    # one pair before (issue 39).
    verdict = _judge_runs(0.3, [(1.0, 0.3)])
    assert verdict.action == "re-measure" and "judged on every pair" in verdict.reason
    done = _judge_runs(0.3, [(1.0, 0.3), (1.0, 1.06), (1.0, 1.061)])
    assert done.action == "revert", done.reason


def test_content_reverted_before_is_kept_only_on_the_whole_re_check():
    repeat = _judge_runs(1.0, [], repeat_of=4)
    assert repeat.action == "re-measure" and "reverted at iteration 4" in repeat.reason
    assert _judge_runs(1.0, [(1.0, 1.0)]).decision.settled_after == 1  # a first try settles
    assert _judge_runs(1.0, [(1.0, 1.0)], repeat_of=4).action == "re-measure"  # a repeat does not
    kept = _judge_runs(1.0, [(1.0, 1.0), (1.001, 1.0), (0.999, 1.001)], repeat_of=4)
    assert (kept.action, kept.decision.rebaseline) == ("keep", False)


def test_the_benchmark_s_bimodal_and_repeated_candidates_are_not_kept():
    """Fixed-seed sessions of ``decision_power.py``'s bimodal and repeated rows (issue 39): +10 % on
    every case, 30 % fast in some of its processes."""
    power = _load_benchmark("decision_power")
    sim = power.Simulator(0.03, 0.0, random.Random(7))
    ref = power.baseline(sim, power.TRUE_MS, 3, T)
    cand = power._scaled(power.TRUE_MS, 1.10)
    # Fast in its try's run and the first pair's: kept "settled after 1 pair" before.
    verdict, runs, _ = power.one_try(sim, ref, power.TRUE_MS, cand, T, cand_factor=lambda k: 0.7 if k < 2 else 1.0)
    assert (verdict.action, verdict.decision.tier, runs) == ("revert", "unstable", 6), verdict.reason
    # Reverted once while slow, then tried again and fast in every process: its whole re-check kept it before.
    prior = {}
    first, _, _ = power.one_try(sim, ref, power.TRUE_MS, cand, T, prior=prior)
    assert first.action == "revert" and prior
    again, _, _ = power.one_try(sim, ref, power.TRUE_MS, cand, T, cand_factor=lambda k: 0.7, repeat_of=1, prior=prior)
    assert (again.action, again.decision.tier) == ("revert", "unstable"), again.reason
    assert "when this content was reverted (iteration 1)" in again.reason
