"""Budgets from what was measured (issue 21 item 1): how long a try takes, the job's clock, and a
batch that runs tries until its budget ends, is cut cleanly, and is continued by the next job.

The batch tests drive a SIMULATED op: the TileGym-shaped repo of ``fixtures_repo`` with a
``ScriptedStages`` for its children (no pytest child, no GPU) and a fake clock that each scripted
stage advances by its own duration, so a try "takes" 40 s of a 100 s budget in milliseconds.
"""
from __future__ import annotations

import json
import shutil

import pytest
import yaml
from fixtures_repo import KERNEL_REL, allow_no_gpu, build_tilegym_like_repo, edit_session, git

from cutile_perf.cli import main
from cutile_perf.errors import UsageError
from cutile_perf.judge.verdict import Stage
from cutile_perf.loop import budget as budget_mod
from cutile_perf.loop.baseline import baseline
from cutile_perf.loop.batch import batch
from cutile_perf.loop.budget import Budget, Timed, estimate, high_quantile
from cutile_perf.store.history import History
from cutile_perf.loop.iteration_state import State, state_key
from scripted_stages import ScriptedStages
from cutile_perf.store import git_ops
from cutile_perf.store import session as session_mod

# --- the pure rule -----------------------------------------------------------------------------------


def test_high_quantile_is_the_slowest_run_until_there_are_ten():
    assert high_quantile([3.0, 1.0, 2.0]) == 3.0
    assert high_quantile([float(v) for v in range(1, 21)]) == 18.0  # nearest rank 0.9 of 20
    assert high_quantile([5.0]) == 5.0


def test_a_typical_try_is_one_correctness_and_one_perf_run_not_the_worst_case():
    """The TileGym op of the issue: correctness ~40 s, perf 68-85 s. The worst case (3 re-check
    pairs) is 635 s; a typical try is 125 s plus the harness, so a 10-minute job runs tries."""
    timed = Timed(correctness=(38.0, 40.0), perf=(68.0, 73.0, 85.0), harness=(0.2, 0.3), judged=0)
    e = estimate(timed, min_pairs=3, max_pairs=3)
    assert e.typical_s == pytest.approx(40.0 + 85.0 + 0.3)
    assert e.worst_s == pytest.approx(40.0 + 85.0 * 7 + 0.3)
    assert e.recheck_s == pytest.approx(6 * 85.0) and e.recheck_rate == pytest.approx(1 / 3)
    assert e.with_recheck_s == pytest.approx(e.typical_s + 6 * 85.0)  # what a try cut before is given
    assert "typically takes 125 s" in e.describe()
    assert estimate(Timed(perf=(1.0,)), 3, 3) is None, "nothing timed yet: no estimate, nothing refused"


def test_the_re_check_counts_in_a_typical_try_once_most_tries_needed_it():
    one = estimate(Timed((10.0,), (30.0,), (), judged=1, rechecks=(3,)), 3, 3)
    assert not one.rechecks_typically and one.typical_s == pytest.approx(40.0)  # 2 of 4 with the prior
    most = estimate(Timed((10.0,), (30.0,), (), judged=2, rechecks=(2, 2)), 3, 3)  # 3 of 5
    assert most.rechecks_typically and most.recheck_pairs == 2  # what the sequential test needed here
    assert most.typical_s == pytest.approx(10.0 + 30.0 + 2 * 2 * 30.0)


def test_history_reads_stage_times_and_re_checks_from_the_rows():
    rows = ({"iteration": 0, "timings": {"harness_s": 0.5,
                                         "stages": [["0-correctness", 9.0], ["0-r1-perf", 7.0], ["0-r2-perf", 8.0]]}},
            {"iteration": 1, "timings": {"harness_s": 0.7,
                                         "stages": [["1-correctness", 11.0], ["1-perf", 7.5],
                                                    ["1-confirm1-base-perf", 8.5], ["1-confirm1-cand-perf", 8.0],
                                                    ["1-confirm2-base-perf", 8.1]]}},
            {"iteration": 2, "timings": {"stages": [["2-correctness", 10.0], ["2-perf", 7.0]]}},
            # Cut by the budget: its last child was killed, not timed; it decided nothing.
            {"iteration": 3, "crash_class": "interrupted", "timings": {"stages": [["3-correctness", 12.0],
                                                                                ["3-perf", 0.4]]}})
    timed = budget_mod.timed(rows)
    assert timed.correctness == (9.0, 11.0, 10.0, 12.0)
    assert timed.perf == (7.0, 8.0, 7.5, 7.0)  # runs of the whole selection; re-check runs apart
    assert timed.harness == (0.5, 0.7) and timed.judged == 2 and timed.rechecks == (2,)
    assert timed.recheck == (pytest.approx(24.6),)


def test_the_re_check_is_estimated_from_what_this_session_s_re_checks_took():
    """Re-checks re-measure the cases in doubt: their measured seconds, not pairs of whole perf runs."""
    e = estimate(Timed((10.0,), (30.0,), (), judged=2, rechecks=(3, 3), recheck=(40.0, 55.0)), 3, 3)
    assert e.rechecks_typically and e.recheck_s == pytest.approx(55.0)
    assert e.typical_s == pytest.approx(10.0 + 30.0 + 55.0)
    assert e.worst_s == pytest.approx(10.0 + 30.0 * 7)  # the worst case still re-checks every case


def test_the_budget_comes_from_the_job_length_less_a_reserve():
    clock = FakeClock()
    assert Budget.for_job(None, 600, clock).seconds == pytest.approx(570)  # 5 %
    assert Budget.for_job(None, 100, clock).seconds == pytest.approx(85)  # at least 15 s
    assert Budget.for_job(200, 600, clock).seconds == 200 and Budget.for_job(900, 600, clock).seconds == 570
    assert Budget.for_job(None, None, clock).left() == float("inf")
    for bad in ((None, 10), (None, float("nan")), (0, None), (-5, None)):
        with pytest.raises(UsageError):
            Budget.for_job(*bad, clock)
    b = Budget(100, clock)
    clock.t += 70
    assert b.left() == 30 and b.cap(600) == 30 and b.cap(20) == 20 and b.fits(30) and not b.fits(31)
    clock.t += 31
    assert b.spent() and b.left() == 0


# --- the simulated op ---------------------------------------------------------------------------------

C_S, P_S = 10.0, 30.0  # one try: 40 s, 40 % of a 100 s budget
BASE = {"a": 1.0, "b": 2.0}
SLOWER = {"a": 1.5, "b": 3.0}
BORDERLINE = {"a": 1.02, "b": 2.0}
TESTS = frozenset({"tests/ops/test_rms_norm.py::test_op[cutile]"})
KERNEL = "rms_norm_kernel"


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def perf(medians: dict) -> Stage:
    return Stage("perf", duration_s=P_S, shapes=dict(medians), test_ids={c: f"t::test_perf[{c}]" for c in medians},
                 kernel_names={c: KERNEL for c in medians})


def simulated_op(clock: FakeClock, candidate_runs: list[dict], reference_commit: str | None = None) -> ScriptedStages:
    """Children of the simulated op: each stage takes its scripted time on the fake clock."""
    return ScriptedStages({("correctness", "candidate"): [Stage("correctness", duration_s=C_S, passed=TESTS)],
                           ("perf", "candidate"): [perf(m) for m in candidate_runs],
                           ("perf", "base"): [perf(BASE)]},
                          reference_commit=reference_commit, defined={KERNEL},
                          on_stage=lambda name, tag, commit: setattr(clock, "t", clock.t + (C_S if name == "correctness"
                                                                                           else P_S)))


@pytest.fixture(scope="module")
def _simulated_session(tmp_path_factory):
    repo = build_tilegym_like_repo(tmp_path_factory.mktemp("simulated-op"))
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    allow_no_gpu(repo)
    # The simulated op repeats its numbers, so a re-check would mostly settle after its first pair
    # (``recheck.settled_early``); these tests price the whole re-check that the budget must hold.
    edit_session(repo, thresholds={"settle_sd": 0.0})
    runs = [BASE, {"a": 1.004, "b": 2.01}, {"a": 0.996, "b": 1.99}]  # a little noise, as measured
    assert baseline(repo=repo, repeats=3, stages=simulated_op(FakeClock(), runs)).exit_code == 0
    return repo


@pytest.fixture
def repo(_simulated_session, tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(_simulated_session, copy, symlinks=True)
    return copy


def write_plan(repo, count: int) -> list[str]:
    """``count`` candidates, each a distinct edit of the fenced kernel; returns their descriptions."""
    (repo / "sandbox/cand").mkdir(parents=True, exist_ok=True)
    kernel = (repo / KERNEL_REL).read_text()
    tries = []
    for n in range(1, count + 1):
        (repo / f"sandbox/cand/c{n}.py").write_text(kernel + f"\n# candidate {n}\n")
        tries.append({"optimization": f"idea {n}", "files": {KERNEL_REL: f"sandbox/cand/c{n}.py"}})
    (repo / "sandbox/plan.yaml").write_text(yaml.safe_dump({"tries": tries}))
    return [t["optimization"] for t in tries]


def reference(repo) -> str:
    return History.open(session_mod.load(repo), git_ops.open_repo(repo)).baseline()["commit"]


def run_job(repo, clock: FakeClock, stages: ScriptedStages, budget_s: float):
    return batch(repo=repo, plan_path=repo / "sandbox/plan.yaml", budget_s=budget_s, stages=stages, now=clock)


def rows(repo) -> list[dict]:
    return [json.loads(line) for line in (repo / "sandbox/experiments.jsonl").read_text().splitlines()]


def assert_settled(repo) -> None:
    """Nothing half-done: no pending state, a clean tree, HEAD at the last kept commit."""
    session = session_mod.load(repo)
    g = git_ops.open_repo(repo)
    assert not State.exists(session)
    assert git(repo, "status", "--porcelain").strip() == ""
    assert git_ops.head(g) == History.open(session, g).kept_commit()


def test_a_try_of_40_percent_of_the_budget_runs_until_the_budget_ends_and_the_next_job_continues(repo):
    names = write_plan(repo, 4)
    clock = FakeClock()
    first = run_job(repo, clock, simulated_op(clock, [SLOWER], reference(repo)), budget_s=100)
    assert [e["decision"] for e in first.data["entries"]] == ["revert", "revert"]
    assert first.data["not_started"] == names[2:] and first.data["cut"] is None
    assert clock.t - 1000.0 == 80.0, "two tries of 40 s ran; the third would not typically fit in 20 s"
    assert_settled(repo)
    plan_before = (repo / "sandbox/plan.yaml").read_bytes()

    clock = FakeClock()
    second = run_job(repo, clock, simulated_op(clock, [SLOWER], reference(repo)), budget_s=100)
    entries = second.data["entries"]
    assert [(e["entry"], e.get("earlier", False)) for e in entries] == [(1, True), (2, True), (3, False), (4, False)]
    assert second.data["not_started"] == [] and "decided by an earlier job" in second.text
    assert [r["optimization"] for r in rows(repo)[1:]] == names, "each entry decided once, in plan order"
    assert (repo / "sandbox/plan.yaml").read_bytes() == plan_before, "the plan file is never edited"
    assert_settled(repo)


def test_a_try_cut_by_the_budgets_end_is_settled_as_interrupted_and_tried_again_by_the_next_job(repo):
    names = write_plan(repo, 2)
    clock = FakeClock()
    # Borderline: the interleaved re-check starts at 40 s. Its floor (6 runs at the perf run's
    # speed, half of it for the one test in doubt: 90 s) fits the 100 s left of a 140 s budget, but
    # its runs take 30 s each, past the budget's end.
    job = run_job(repo, clock, simulated_op(clock, [BORDERLINE, BASE], reference(repo)), budget_s=140)
    cut = job.data["entries"][0]
    # cut in the re-check: the reason names the run (a re-check run is a perf run of one side)
    assert cut["cut"] and "ran out during the perf run confirm" in cut["cut"] and job.data["cut"] == names[0]
    assert job.data["not_started"] == names[1:] and "next job" in job.text
    row = rows(repo)[-1]
    # The correctness tests passed before the job's end cut the perf run (issue 44 item 3).
    assert (row["status"], row["crash_class"], row["correctness"]) == ("crash", "interrupted", "PASS")
    assert row["plan_entry"]
    assert "not a verdict" in row["reason"] and (repo / row["patch"]).exists()
    assert_settled(repo)

    # A job of 100 s: idea 1 would need its re-check again (220 s), more than the whole budget, so
    # it is passed over with that said, and idea 2 runs.
    clock = FakeClock()
    job = run_job(repo, clock, simulated_op(clock, [SLOWER], reference(repo)), budget_s=100)
    assert [(e["optimization"], e["decision"]) for e in job.data["entries"]] == [(names[1], "revert")]
    assert job.data["not_started"] == names[:1] and "give it a longer job" in job.text
    assert_settled(repo)

    # A longer job: idea 1 re-measured in full (3 pairs, within noise: kept); idea 2 decided earlier.
    clock = FakeClock()
    job = run_job(repo, clock, simulated_op(clock, [BORDERLINE, BASE], reference(repo)), budget_s=1000)
    assert [(e["optimization"], e["decision"], e.get("earlier", False)) for e in job.data["entries"]] == [
        (names[0], "keep", False), (names[1], "revert", True)]
    assert [(r["optimization"], r["status"]) for r in rows(repo)[1:]] == [
        (names[0], "crash"), (names[1], "revert"), (names[0], "keep")]
    assert job.data["not_started"] == [] and job.data["cut"] is None
    assert_settled(repo)


def test_a_re_check_that_cannot_end_in_time_is_not_started_and_the_next_entry_runs_in_its_place(repo):
    names = write_plan(repo, 2)
    clock = FakeClock()
    stages = simulated_op(clock, [BORDERLINE, SLOWER], reference(repo))
    # Idea 1's perf run ends at 40 s of 100: its re-check needs at least 90 s (3 pairs of its one
    # test in doubt at the perf run's own speed), so none of it starts; idea 2 (a typical 40 s) does.
    job = run_job(repo, clock, stages, budget_s=100)
    assert not [tag for _, tag, _ in stages.calls if "confirm" in tag], "no re-check run started"
    first, second = job.data["entries"]
    assert first["cut"] and "cannot hold the re-check: it needs at least 90 s" in first["cut"]
    assert (second["optimization"], second["decision"]) == (names[1], "revert")
    assert clock.t - 1000.0 == 80.0 and job.data["cut"] == names[0] and "next job" in job.text
    assert "no verdict (the job's time budget cannot hold the re-check" in job.text
    row = next(r for r in rows(repo) if r["optimization"] == names[0])
    assert (row["status"], row["crash_class"]) == ("crash", "interrupted") and "not a verdict" in row["reason"]
    assert_settled(repo)


def test_the_re_check_floor_is_its_pairs_at_the_perf_run_s_own_speed_for_its_share_of_the_tests():
    assert budget_mod.recheck_floor_s(30.0, tests_in_doubt=1, tests_run=2, min_pairs=3) == pytest.approx(90.0)
    assert budget_mod.recheck_floor_s(16.4, tests_in_doubt=8, tests_run=8, min_pairs=3) == pytest.approx(98.4)
    assert budget_mod.recheck_floor_s(10.0, tests_in_doubt=0, tests_run=0, min_pairs=3) == pytest.approx(60.0)


def test_a_stage_starts_only_before_the_budgets_end_and_try_refuses_what_does_not_typically_fit(repo):
    from cutile_perf.loop.iteration import try_change  # noqa: PLC0415 - the library call under test

    (repo / KERNEL_REL).write_text((repo / KERNEL_REL).read_text() + "\n# by hand\n")
    clock = FakeClock()
    before = rows(repo)
    with pytest.raises(budget_mod.DoesNotFit, match="typically takes 40 s"):
        try_change(repo, "by hand", stages=simulated_op(clock, [SLOWER], reference(repo)), budget=Budget(39, clock))
    assert rows(repo) == before and "# by hand" in (repo / KERNEL_REL).read_text(), "refused: nothing touched"
    result = try_change(repo, "by hand", stages=simulated_op(clock, [SLOWER], reference(repo)),
                        budget=Budget(45, clock))
    assert result.cut is None and result.row["status"] == "revert"


def test_a_job_killed_mid_try_is_finished_by_the_next_batch(repo):
    """Killed by the job's own limit after the candidate commit (the budget was not given): the next
    batch finishes that iteration as ``resume`` would, then tries the entry again."""
    names = write_plan(repo, 2)
    session = session_mod.load(repo)
    g = git_ops.open_repo(repo)
    base = git_ops.head(g)
    shutil.copyfile(repo / "sandbox/cand/c1.py", repo / KERNEL_REL)
    git(repo, "commit", "-qam", "cutile-perf 1: killed")
    from cutile_perf.loop import plan  # noqa: PLC0415 - only this test names an entry by hand

    entry = plan.parse((repo / "sandbox/plan.yaml").read_text())[0]
    State(file=State.path(session), key=state_key(g), iteration=1, optimization=names[0], name="001-idea-1",
          base=base, reference=reference(repo), paths=[KERNEL_REL], step="committed", candidate=git_ops.head(g),
          plan_entry=plan.digest(entry, repo)).save()
    clock = FakeClock()
    job = run_job(repo, clock, simulated_op(clock, [SLOWER], reference(repo)), budget_s=1000)
    assert any("iteration 1: crash (interrupted)" in a for a in job.data["actions"])
    assert [(r["iteration"], r["status"]) for r in rows(repo)[1:]] == [(1, "crash"), (2, "revert"), (3, "revert")]
    assert_settled(repo)


def test_a_candidate_copy_left_by_a_killed_job_is_put_back_not_refused(repo):
    write_plan(repo, 1)
    shutil.copyfile(repo / "sandbox/cand/c1.py", repo / KERNEL_REL)
    clock = FakeClock()
    job = run_job(repo, clock, simulated_op(clock, [SLOWER], reference(repo)), budget_s=1000)
    assert any(a.startswith(f"put back {KERNEL_REL}") for a in job.data["actions"])
    assert [e["decision"] for e in job.data["entries"]] == ["revert"]
    assert_settled(repo)
    (repo / KERNEL_REL).write_text((repo / KERNEL_REL).read_text() + "\n# the user's own work\n")
    with pytest.raises(Exception, match="uncommitted changes to fenced files"):
        run_job(repo, clock, simulated_op(clock, [SLOWER], reference(repo)), budget_s=1000)


def test_check_counts_the_open_entries_a_typical_try_lets_the_job_hold(repo, capsys):
    write_plan(repo, 3)
    code = main(["batch", "--repo", str(repo), "--json", str(repo / "sandbox/plan.yaml"), "--check",
                 "--job-seconds", "100"])
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # Stage times of the baseline: correctness 10 s, perf 30 s; 85 s of budget hold two 40 s tries.
    assert (code, data["ready"], data["entries_that_fit"], data["budget_s"]) == (0, True, 2, 85.0)
    assert data["try_seconds"] == pytest.approx(40.0, abs=2.0) and data["try_seconds_bound"] > 200
    assert data["decided_earlier"] == 0
