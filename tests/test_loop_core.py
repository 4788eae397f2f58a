"""The loop core's pure pieces: pristine checkouts, the signed run report, the judge, the crash table."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures_repo import build_tilegym_like_repo, git

from cutile_perf.judge import crash, paired
from cutile_perf.store import git_ops
from cutile_perf.child import pristine, runreport
from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.verdict import Evidence, Reference, Stage, judge, paired_samples
from cutile_perf.judge.rules import Thresholds

T = Thresholds()


def pairs_of(paired: dict) -> tuple:
    """``{case: (baseline runs, candidate runs)}`` as the judge's interleaved (baseline, candidate) stage pairs."""
    rounds = min(min(len(b), len(c)) for b, c in paired.values())
    return tuple((Stage(shapes={k: b[i] for k, (b, _) in paired.items()}),
                  Stage(shapes={k: c[i] for k, (_, c) in paired.items()})) for i in range(rounds))
REF = Reference(commit="base", medians={"a": 1.0, "b": 2.0}, noise={"a": 0.01, "b": 0.01},
                passed_tests=frozenset({"t::one", "t::two"}))


# --- pristine checkouts ---------------------------------------------------------------------------


def test_checkout_takes_protected_files_from_base_fenced_from_candidate_and_skips_startup_files(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    (repo / "sitecustomize.py").write_text("raise SystemExit('ran')\n")
    (repo / "evil.pth").write_text("import os\n")
    (repo / "src" / "stale.pyc").write_bytes(b"\x00\x01")
    (repo / "escape").symlink_to("/etc/hostname")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "start-up files")
    base = git(repo, "rev-parse", "HEAD").strip()
    kernel = "src/fakegym/ops/cutile/rms_norm.py"
    (repo / kernel).write_text((repo / kernel).read_text() + "\n# candidate\n")
    (repo / "tests/ops/test_rms_norm.py").write_text("# the candidate may not change tests\n")
    git(repo, "commit", "-qam", "candidate")
    cand = git(repo, "rev-parse", "HEAD").strip()
    (repo / kernel).write_text("# uncommitted work tree content is never measured\n")
    (repo / "tests/conftest.py").write_text("# hidden, uncommitted\n")

    g = git_ops.open_repo(repo)
    checkout = pristine.build(g, protected_from=base, fenced_from=cand, fence=[kernel])
    try:
        root = checkout.root
        assert (root / kernel).read_text().endswith("# candidate\n")
        assert "def test_perf" in (root / "tests/ops/test_rms_norm.py").read_text()
        assert "sys.path.insert" in (root / "tests/conftest.py").read_text()
        for skipped in ("sitecustomize.py", "evil.pth", "src/stale.pyc", "escape"):
            assert not (root / skipped).exists() and skipped in checkout.skipped
        assert not pristine.is_inside(repo, root) and kernel in checkout.written
        assert pristine.module_name(root, kernel) == "fakegym.ops.cutile.rms_norm"
        assert pristine.package_roots(root, [kernel])[0] == root / "src"
    finally:
        checkout.remove()
    assert not checkout.root.exists()


def test_checkout_bytes_are_the_raw_blobs_whatever_the_attributes_say(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    kernel = "src/fakegym/ops/cutile/rms_norm.py"
    git(repo, "config", "filter.strip.smudge", "sed s/LATENCY/SMUDGED/")
    (repo / ".git/info/attributes").write_text(f"{kernel} filter=strip\n")
    g = git_ops.open_repo(repo)
    head = git_ops.head(g)
    checkout = pristine.build(g, protected_from=head, fenced_from=head, fence=[kernel])
    try:
        assert "LATENCY_MS" in (checkout.root / kernel).read_text()
    finally:
        checkout.remove()


# --- the signed run report ------------------------------------------------------------------------


def test_run_report_tells_its_own_lines_from_forged_ones_and_a_missing_end(tmp_path):
    path, key = tmp_path / "report.jsonl", runreport.new_key()
    writer = runreport.Writer(path, key)
    writer.write({"type": "test", "nodeid": "t::one", "outcome": "passed"})
    writer.write({"type": "record", "nodeid": "t::perf", "outcome": "passed", "benchmark": {"cutile": {}}})
    report = runreport.read(path, key)
    assert report.passed() == {"t::one"} and not report.ended and not report.forged
    with path.open("a") as fh:  # a line appended by someone without the key
        fh.write(json.dumps({"type": "end", "exitstatus": 0, "seq": 2, "mac": "0" * 64}) + "\n")
    report = runreport.read(path, key)
    assert not report.ended and report.forged == ["line 3: bad signature"]
    writer.write({"type": "end", "exitstatus": 0, "collected": 1})
    assert runreport.read(path, key).ended
    assert runreport.read(path, b"another key").forged  # every line fails under another key


@pytest.mark.parametrize("when, outcome, xfail, expected", [
    ("call", "passed", False, "passed"), ("call", "failed", False, "failed"), ("setup", "skipped", False, "skipped"),
    ("call", "skipped", True, "xfailed"), ("call", "passed", True, "xpassed"), ("setup", "failed", False, "error"),
    ("teardown", "passed", False, None)])
def test_outcome_of_each_phase(when, outcome, xfail, expected):
    assert runreport.outcome_of(when, outcome, xfail) == expected


# --- the judge --------------------------------------------------------------------------------------


def test_correctness_needs_every_baseline_test_to_pass_again_and_the_end_marker():
    ok = Stage(passed=frozenset({"t::one", "t::two"}))
    assert judge(REF, T, Evidence(correctness=ok)).action == "continue"
    skipped = Stage(passed=frozenset({"t::one"}), not_passed={"t::two": "skipped"})
    verdict = judge(REF, T, Evidence(correctness=skipped))
    assert (verdict.action, verdict.crash_class) == ("crash", "incomplete-tests") and "skipped" in verdict.reason
    assert judge(REF, T, Evidence(correctness=Stage(passed=ok.passed, ended=False))).crash_class == "incomplete-tests"
    assert judge(REF, T, Evidence(correctness=Stage())).crash_class == "incomplete-tests"
    wrong = judge(REF, T, Evidence(correctness=Stage(crash=CrashClass.WRONG_RESULT, detail="mismatch")))
    assert (wrong.action, wrong.crash_class) == ("revert", "wrong-result")


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -1.0, 1e-300])
def test_impossible_medians_are_bad_records(value):
    ok = Stage(passed=frozenset({"t::one", "t::two"}))
    verdict = judge(REF, T, Evidence(correctness=ok, perf=Stage(shapes={"a": value, "b": 2.0})))
    assert (verdict.action, verdict.crash_class) == ("crash", "bad-record")


def test_a_claim_beyond_the_plausibility_factor_is_re_measured_and_flagged():
    ok = Stage(passed=frozenset({"t::one", "t::two"}))
    fast = Stage(shapes={"a": 0.2, "b": 0.4})
    assert judge(REF, T, Evidence(correctness=ok, perf=fast)).action == "re-measure"
    paired = {"a": ([1.0, 1.01, 0.99], [0.2, 0.202, 0.198]), "b": ([2.0, 2.01, 1.99], [0.4, 0.402, 0.398])}
    verdict = judge(REF, T, Evidence(correctness=ok, perf=fast, pairs=pairs_of(paired)))
    assert verdict.action == "keep" and verdict.review and "review" in verdict.reason


def test_a_small_real_slowdown_is_re_measured_against_the_baseline_and_caught():
    ref = Reference(commit="base", medians={"a": 1.0, "b": 2.0}, noise={"a": 0.02, "b": 0.02},
                    runs={"a": [1.0, 1.004, 0.996], "b": [2.0, 2.008, 1.992]})
    single = Stage(shapes={"a": 1.02, "b": 2.0})  # inside the 3 % gate
    assert judge(ref, T, Evidence(perf=single)).action == "re-measure"
    paired = {"a": ([1.0, 1.003, 0.998], [1.04, 1.043, 1.038]), "b": ([2.0, 2.004, 1.998], [2.0, 2.003, 2.001])}
    verdict = judge(ref, T, Evidence(perf=single, pairs=pairs_of(paired)))
    assert (verdict.action, verdict.decision.tier) == ("revert", "regression"), verdict.reason


# --- the partial re-check: only the cases in doubt ------------------------------------------------

REF3 = Reference(commit="base", medians={"a": 1.0, "b": 2.0, "c": 4.0}, noise={"a": 0.01, "b": 0.01, "c": 0.01},
                 runs={"a": [1.0, 1.005, 0.995], "b": [2.0, 2.01, 1.99], "c": [4.0, 4.02, 3.98]})


def pairs_of_cases(paired: dict) -> tuple:
    """Interleaved pairs that measured only ``paired``'s cases, as runs selected by node id do."""
    asked = tuple(sorted(paired))
    return tuple((replace(b, cases=asked), replace(c, cases=asked)) for b, c in pairs_of(paired))


def test_a_single_run_with_one_risen_case_re_measures_that_case_alone():
    single = Stage(shapes={"a": 1.01, "b": 2.0, "c": 3.99})  # a: +1 %, inside its 1.5 % gate
    verdict = judge(REF3, T, Evidence(perf=single))
    assert (verdict.action, verdict.cases) == ("re-measure", ("a",))
    assert "1 of 3 cases in doubt (a)" in verdict.reason


def test_pairs_of_the_case_in_doubt_decide_with_the_others_single_run():
    single = Stage(shapes={"a": 1.01, "b": 2.0, "c": 3.99})
    paired = {"a": ([1.0, 1.004, 0.998], [1.001, 1.003, 0.999])}
    verdict = judge(REF3, T, Evidence(perf=single, pairs=pairs_of_cases(paired)))
    assert (verdict.action, verdict.decision.tier, verdict.decision.source) == ("keep", "no-change", "partial")
    assert verdict.decision.rechecked == ["a"] and "1 of 3 cases re-measured" in verdict.reason
    assert verdict.decision.changes["b"] == pytest.approx(0.0)  # b and c: the single run's evidence
    assert verdict.decision.changes["a"] == pytest.approx(1.001 / 1.0 - 1)  # a: its paired median ratio


def test_a_real_slowdown_of_the_case_in_doubt_is_reverted_by_its_pairs():
    single = Stage(shapes={"a": 1.01, "b": 2.0, "c": 3.99})
    paired = {"a": ([1.0, 1.002, 0.999], [1.012, 1.013, 1.011])}
    verdict = judge(REF3, T, Evidence(perf=single, pairs=pairs_of_cases(paired)))
    assert (verdict.action, verdict.decision.tier, verdict.decision.source) == ("revert", "regression", "partial")


def test_a_geomean_in_doubt_after_the_partial_pairs_re_measures_the_other_cases_too():
    # a rose in the single run; re-measured, it is 4 % faster, and that puts the geomean (b, c at
    # their single-run 1 % faster) in the borderline-faster band: the geomean rests on every case.
    single = Stage(shapes={"a": 1.01, "b": 1.98, "c": 3.96})
    paired = {"a": ([1.0, 1.001, 0.999], [0.96, 0.961, 0.959])}
    first = pairs_of_cases(paired)
    verdict = judge(REF3, T, Evidence(perf=single, pairs=first))
    assert (verdict.action, verdict.cases) == ("re-measure", ("b", "c"))
    rest = pairs_of_cases({"b": ([2.0, 2.002, 1.998], [1.98, 1.981, 1.979]),
                           "c": ([4.0, 4.004, 3.996], [3.96, 3.962, 3.958])})
    verdict = judge(REF3, T, Evidence(perf=single, pairs=first + rest))
    assert verdict.final and verdict.decision.source == "confirm", verdict.reason  # the whole re-check decides


def test_an_implausible_claim_on_one_case_is_re_measured_alone_and_the_geomean_follows_its_pairs():
    single = Stage(shapes={"a": 0.2, "b": 2.0, "c": 4.0})  # a claims 5x
    assert judge(REF3, T, Evidence(perf=single)).cases == ("a",)
    held = {"a": ([1.0, 1.002, 0.999], [0.2, 0.201, 0.199])}
    verdict = judge(REF3, T, Evidence(perf=single, pairs=pairs_of_cases(held)))
    assert (verdict.action, verdict.decision.tier, verdict.review) == ("keep", "new-baseline", True)
    assert "a still beyond 3x" in verdict.reason
    gone = {"a": ([1.0, 1.002, 0.999], [1.0, 1.001, 0.999])}  # the claim does not reproduce
    verdict = judge(REF3, T, Evidence(perf=single, pairs=pairs_of_cases(gone)))
    # Its pairs decide: no change, kept without moving the baseline (a single run that disagrees with
    # them only keeps the re-check from settling early).
    assert (verdict.action, verdict.decision.tier, verdict.decision.rebaseline) == ("keep", "no-change", False)


def test_the_partial_re_check_stops_at_its_first_decisive_pair():
    # The sequential rule judge_paired applies to every case, here to the case in doubt: at least
    # min_confirm_pairs, then one more pair at a time while the verdict would be "no-change".
    t = Thresholds(min_confirm_pairs=3, max_confirm_pairs=5)
    single = Stage(shapes={"a": 1.01, "b": 2.0, "c": 3.99})
    slower = {"a": ([1.0, 1.002, 0.999], [1.012, 1.013, 1.011])}
    assert judge(REF3, t, Evidence(perf=single, pairs=pairs_of_cases(slower))).action == "revert"  # 3 of up to 5
    even = {"a": ([1.0, 1.004, 0.998], [1.001, 1.003, 0.999])}
    verdict = judge(REF3, t, Evidence(perf=single, pairs=pairs_of_cases(even)))
    assert (verdict.action, verdict.cases) == ("re-measure", ("a",))
    even5 = {"a": ([1.0, 1.004, 0.998, 1.001, 0.999], [1.001, 1.003, 0.999, 1.0, 1.002])}
    assert judge(REF3, t, Evidence(perf=single, pairs=pairs_of_cases(even5))).action == "keep"


def test_a_run_of_the_cases_in_doubt_needs_records_of_those_cases_only():
    single = Stage(shapes={"a": 1.01, "b": 2.0, "c": 3.99})
    fine = (Stage(shapes={"a": 1.0}, cases=("a",)), None)
    assert judge(REF3, T, Evidence(perf=single, pairs=(fine,))).cases == ("a",)  # its candidate run is next
    lacking = (Stage(shapes={"b": 2.0}, cases=("a",)), None)
    verdict = judge(REF3, T, Evidence(perf=single, pairs=(lacking,)))
    assert (verdict.action, verdict.crash_class) == ("crash", "no-record") and "interleaved" in verdict.reason


def test_a_re_check_run_killed_by_the_budget_is_the_crash_and_its_pair_lends_no_sample():
    # Found when a candidate's re-check run was killed by the job's budget: the row then asked the
    # crashed run for the case it never measured (KeyError, exit 70, instead of a crash row).
    single = Stage(shapes={"a": 1.01, "b": 2.0, "c": 3.99})
    first = (Stage(shapes={"a": 1.0}, cases=("a",)), Stage(shapes={"a": 1.011}, cases=("a",)))
    killed = (Stage(shapes={"a": 1.001}, cases=("a",)), Stage(crash=CrashClass.TIMEOUT, cases=("a",)))
    evidence = Evidence(perf=single, pairs=(first, killed))
    verdict = judge(REF3, T, evidence)
    assert (verdict.action, verdict.crash_class) == ("crash", "timeout") and "interleaved" in verdict.reason
    assert paired_samples(evidence.pairs, ["a", "b", "c"])["a"] == ([1.0], [1.011])


def test_fewer_pairs_than_the_minimum_ask_for_more_unless_settled_early():
    paired = {"a": ([1.0], [1.0]), "b": ([2.0], [2.0])}
    evidence = Evidence(perf=Stage(shapes={"a": 1.0, "b": 2.0}), pairs=pairs_of(paired))
    assert judge(REF, Thresholds(settle_sd=0.0), evidence).action == "re-measure"
    # One pair the same to the last digit, against the baseline's own spread: no pair to come within
    # settle_sd of it could make this anything but "within noise".
    settled = judge(REF, T, evidence)
    assert (settled.action, settled.decision.tier, settled.decision.settled_after) == ("keep", "no-change", 1)
    # Its figures are the one pair's: no change, and no interval (one pair has none to give).
    assert settled.decision.geomean_change == 0.0 and settled.decision.paired_z == {"a": 0.0, "b": 0.0}
    assert "geomean +0.0 %, z = 0.0" in settled.reason and "interval" not in settled.reason


def test_thresholds_reject_non_finite_and_inconsistent_values():
    for bad in ({"noise_k": math.nan}, {"plausible_factor": 1.0}, {"min_confirm_pairs": 4, "max_confirm_pairs": 3},
                {"patience": 1.5}, {"keep": True}):
        with pytest.raises(ValueError):
            Thresholds.from_dict(bad)


# --- the crash classes and their docs table -------------------------------------------------------


def test_harness_doc_carries_the_generated_crash_class_table():
    text = (Path(__file__).resolve().parents[1] / "references" / "harness.md").read_text(encoding="utf-8")
    inside = text.split("<!-- crash-classes:begin -->\n", 1)[1].split("<!-- crash-classes:end -->", 1)[0]
    assert inside == crash.markdown_table(), "regenerate with cutile_perf.judge.crash.markdown_table()"



def test_correctness_of_a_stopped_iteration_is_not_run_and_of_a_failed_one_fail():
    from cutile_perf.judge.verdict import NOT_RUN, correctness_status, stopped

    assert correctness_status(stopped(KeyboardInterrupt()), perf_ran=False) == NOT_RUN == "not run"
    assert correctness_status(stopped(None, "killed"), perf_ran=True) == NOT_RUN
    assert correctness_status(stopped(RuntimeError("child failed")), perf_ran=False) == "FAIL"

def test_only_wrong_or_impossible_results_are_revert_rows():
    # A wrong answer, untimed or timed, and a time below the physics floor are the change's fault: revert rows.
    assert [c.value for c in crash.CrashClass if c.row_status == "revert"] == [
        "wrong-result", "wrong-when-timed", "implausible"]
    assert crash.CrashClass("tampered") is crash.CrashClass.TAMPERED and str(crash.CrashClass.FAULT) == "fault"


def test_changed_thresholds_are_the_ones_away_from_their_defaults():
    assert Thresholds().changed() == []
    assert Thresholds.from_dict({"plausible_factor": 30.0, "keep": 0.02}).changed() == [("plausible_factor", 30.0, 3.0)]


def test_decide_module_keeps_its_frozen_defaults():
    # The defaults are part of every session's frozen rules; changing one is a deliberate act.
    assert (T.noise_k, T.min_noise, T.recheck_fraction, T.slower_z, T.plausible_factor, T.min_confirm_pairs,
            T.settle_sd) == (1.5, 0.005, 0.25, 2.75, 3.0, 3, 3.0)
    assert paired.NOISE_WIDTH_PER_SD == 3.5


def test_a_threshold_added_after_a_baseline_froze_its_rules_must_sit_at_its_default():
    from cutile_perf.store.history import _same_frozen

    now = Thresholds().to_dict()
    before_settling = {k: v for k, v in now.items() if k != "settle_sd"}  # a log frozen before the rule existed
    assert _same_frozen("thresholds", before_settling, now)
    assert not _same_frozen("thresholds", before_settling, {**now, "settle_sd": 0.5})  # edited after the baseline
    assert not _same_frozen("thresholds", before_settling, {**now, "slower_z": 2.0})
    assert not _same_frozen("thresholds", now, before_settling)  # a frozen threshold taken out
    assert _same_frozen("timeout_s", 600.0, 600.0) and not _same_frozen("timeout_s", 600.0, 60.0)


# --- every direction counts -----------------------------------------------------------------------


def test_forward_and_backward_records_are_cases_of_their_own_and_a_backward_regression_reverts():
    from cutile_perf.child import measure

    value = {"cutile": {"forward": {"median": 1.0}, "backward": {"median": 3.0}},
             "torch": {"forward": {"median": 9.0}}}
    medians, test_ids, _names, problem = measure.cases_from_records(
        [("tests/ops/test_x.py::test_perf[cutile-1024]", "passed", value)])
    assert problem is None and medians == {"1024": 1.0, "1024@backward": 3.0}
    assert measure.direction_of("1024@backward") == "backward" and measure.direction_of("1024") == "forward"
    ref = Reference(commit="base", medians=medians, noise={c: 0.005 for c in medians})
    slower_backward = Stage(shapes={"1024": 1.0, "1024@backward": 3.6})
    verdict = judge(ref, T, Evidence(perf=slower_backward))
    assert verdict.action == "revert" and verdict.decision.worst_shape == "1024@backward", verdict.reason


def test_a_case_recorded_twice_is_a_bad_record():
    from cutile_perf.child import measure

    value = {"cutile": {"forward": {"median": 1.0}}}
    found = [("t.py::test_perf[cutile-8]", "passed", value), ("t.py::test_perf[cutile-8]", "passed", value)]
    assert "two records" in measure.cases_from_records(found)[3]


def test_prior_ratios_reads_what_reverted_rows_of_the_same_content_measured():
    """``loop.row.prior_ratios``: the judge's evidence of a repeat's spread (``Evidence.prior_ratios``)."""
    from cutile_perf.loop.row import prior_ratios
    ref = Reference(commit="base", medians={"a": 1.0, "b": 2.0}, noise={"a": 0.01, "b": 0.01})
    slow = {"status": "revert", "content_hash": "h", "reference_commit": "base",
            "shapes": {"a": {"median": 1.1}, "b": {"median": 2.2}},
            "confirm": {"a": {"base": [1.0, 2.0], "candidate": [1.1, 2.2]}}}
    rows = [slow,
            {**slow, "content_hash": "other", "shapes": {"a": {"median": 0.5}}},  # other content
            {**slow, "status": "keep", "shapes": {"a": {"median": 0.5}}},  # not reverted
            {**slow, "reference_commit": "older", "confirm": {}, "shapes": {"a": {"median": 0.5}}},  # another baseline
            {**slow, "decision": {"tier": "baseline-drift"}, "confirm": {"a": {"base": [2.0], "candidate": [1.0]}}},
            {**slow, "confirm": None, "shapes": {"a": {"median": "nan"}, "b": {"median": 1.9}}}]  # unreadable median
    got = prior_ratios(rows, "h", ref)
    assert {c: [round(r, 6) for r in v] for c, v in got.items()} == {"a": [1.1, 1.1, 1.1], "b": [1.1, 0.95]}
    assert prior_ratios(rows, "never tried", ref) == {}
