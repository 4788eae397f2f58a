"""What a re-check costs (issue 41 item 5): the budget prices the interleaved re-check about to
start from what it will re-run and from how this session's re-checks went, and still never lets
one run past the job's end.

The pure rule (``budget.past_rechecks``, ``budget.recheck_cost``) is tested on synthetic rows; the
loop tests drive the SIMULATED op of ``test_batch_budget`` (the TileGym-shaped repo of
``fixtures_repo``, scripted children on a fake clock: no pytest child, no GPU).
"""
from __future__ import annotations

import shutil

import pytest
import yaml
from fixtures_repo import KERNEL_REL, allow_no_gpu, build_tilegym_like_repo, edit_session, git
from test_batch_budget import (BASE, BORDERLINE, C_S, P_S, SLOWER, FakeClock, assert_settled, reference, rows,
                               simulated_op)

from cutile_perf.cli import main
from cutile_perf.loop import budget as budget_mod
from cutile_perf.loop.baseline import baseline
from cutile_perf.loop.batch import batch
from cutile_perf.loop.budget import PastRecheck, past_rechecks, recheck_cost

# --- the pure rule -----------------------------------------------------------------------------------

SHAPES = {"a": {"median": 1.0, "test_id": "t::p[a]"}, "b": {"median": 2.0, "test_id": "t::p[b]"}}


def try_row(iteration: int, pairs: int, run_s: float = 20.0, perf_s: float = 30.0, status: str = "keep",
            cases: tuple[str, ...] = ("a",), **extra) -> dict:
    """A try whose re-check ran ``pairs`` pairs of ``cases``, each run taking ``run_s``."""
    stages = [[f"{iteration}-correctness", 10.0], [f"{iteration}-perf", perf_s]]
    stages += [[f"{iteration}-confirm{k}-{side}-perf", run_s] for k in range(1, pairs + 1) for side in ("base", "cand")]
    return {"iteration": iteration, "status": status, "shapes": SHAPES, "timings": {"stages": stages},
            "confirm": {c: {"base": [1.0] * pairs, "candidate": [1.0] * pairs} for c in cases}, **extra}


def test_a_past_re_check_is_read_as_its_pairs_runs_and_tests_re_run():
    (past,) = past_rechecks([{"iteration": 0, "timings": {"stages": [["0-r1-perf", 30.0]]}},
                             try_row(1, pairs=2, run_s=20.0)])
    assert (past.pairs, past.runs, past.seconds, past.perf_s, past.decided) == (2, 4, 80.0, 30.0, True)
    # 4 runs of 1 of the 2 tests: 2 whole perf runs' worth of tests (60 s); the other 20 s are start-up.
    assert past.whole_runs == pytest.approx(2.0) and past.start_s == pytest.approx(5.0)


def test_cases_of_one_perf_test_count_as_one_test_re_run():
    shapes = {"a": {"test_id": "t::p"}, "b": {"test_id": "t::p"}, "c": {"test_id": "t::q"}}
    (past,) = past_rechecks([try_row(1, pairs=1, cases=("a", "b"), shapes=shapes)])
    assert past.whole_runs == pytest.approx(2 * 1 / 2), "t::p re-run twice, of 2 tests"


def test_rows_that_were_cut_or_say_too_little_are_not_read():
    cut = try_row(1, pairs=1, status="crash", crash_class="interrupted")
    no_confirm = {**try_row(2, pairs=1), "confirm": None}
    no_recheck = try_row(3, pairs=0)
    assert past_rechecks([cut, no_confirm, no_recheck]) == ()
    (crashed,) = past_rechecks([try_row(4, pairs=1, status="crash", crash_class="fault")])
    assert not crashed.decided, "a crash in the re-check times its runs, but says nothing of how re-checks settle"


def test_with_too_few_re_checks_timed_the_cost_is_todays_floor():
    one = past_rechecks([try_row(1, pairs=1)])
    for past in ((), one):
        cost = recheck_cost(past, perf_run_s=30.0, tests_in_doubt=1, tests_run=2, min_pairs=3, max_pairs=3)
        assert cost.seconds == pytest.approx(budget_mod.recheck_floor_s(30.0, 1, 2, 3)) == pytest.approx(90.0)
        assert cost.pairs == 3 and "at least 90 s (3 pairs at the perf run's own speed" in cost.describe()


def test_re_checks_that_settled_after_one_pair_price_one_pair_with_the_measured_start_up():
    past = past_rechecks([try_row(1, pairs=1, run_s=20.0), try_row(2, pairs=1, run_s=22.0)])
    cost = recheck_cost(past, perf_run_s=30.0, tests_in_doubt=1, tests_run=2, min_pairs=3, max_pairs=3)
    # Start-up: 20 s and 22 s runs of half of a 30 s run: 5 and 7 s; the slower one counts.
    assert cost.pairs == 1 and cost.start_s == pytest.approx(7.0)
    assert cost.seconds == pytest.approx(2 * 1 * (7.0 + 15.0))
    assert cost.describe() == ("about 44 s (1 of 2 perf tests in doubt; re-checks here settled after 1 pair, "
                               "so 1 pair; 7 s start-up a run)")


def test_the_pairs_are_the_slow_end_of_what_re_checks_needed_within_the_judge_s_maximum():
    def pairs(*needed: int, max_pairs: int = 3) -> int:
        past = past_rechecks([try_row(n, pairs=p) for n, p in enumerate(needed, 1)])
        return recheck_cost(past, 30.0, 1, 2, min_pairs=3, max_pairs=max_pairs).pairs

    assert pairs(1, 1, 3) == 3 and pairs(1, 2) == 2 and pairs(1, 1) == 1
    assert pairs(*[1] * 19, 3) == 1, "nearest rank 0.9 of 20: one slow re-check in twenty is not the rule"
    assert pairs(4, 5, max_pairs=4) == 4, "replaced pairs beyond the maximum are the budget's end's to cut"
    assert "settled after 1-3 pairs, so 3 pairs" in recheck_cost(
        past_rechecks([try_row(1, pairs=1), try_row(2, pairs=3)]), 30.0, 2, 2, 3, 3).describe()


def test_runs_quicker_than_their_share_give_no_negative_start_up():
    past = past_rechecks([try_row(1, pairs=1, run_s=10.0), try_row(2, pairs=1, run_s=12.0)])
    cost = recheck_cost(past, perf_run_s=30.0, tests_in_doubt=2, tests_run=2, min_pairs=3, max_pairs=3)
    assert cost.start_s == 0.0 and cost.seconds == pytest.approx(2 * 30.0), "never below the tests' own time"


def test_a_crashed_re_check_times_the_start_up_but_not_the_pairs():
    past = (PastRecheck(1, 2, 40.0, 1.0, 30.0, True), PastRecheck(1, 2, 40.0, 1.0, 30.0, True),
            PastRecheck(1, 2, 100.0, 1.0, 30.0, False))
    cost = recheck_cost(past, 30.0, 1, 2, min_pairs=3, max_pairs=3)
    assert cost.pairs == 1 and cost.start_s == pytest.approx(35.0)


# --- the loop: a batch entry's re-check, priced from the session's own re-checks ---------------------------

def write_plan(repo, numbers: list[int]) -> list[str]:
    """Plan entries ``idea n``, each the repository's first kernel plus its own line: the same bytes
    in every job, so an entry decided earlier is recognised however the kept code moved since."""
    first = git(repo, "rev-list", "--max-parents=0", "HEAD").split()[0]
    kernel = git(repo, "show", f"{first}:{KERNEL_REL}")
    (repo / "sandbox/cand").mkdir(parents=True, exist_ok=True)
    tries = []
    for n in numbers:
        (repo / f"sandbox/cand/c{n}.py").write_text(kernel + f"\n# candidate {n}\n")
        tries.append({"optimization": f"idea {n}", "files": {KERNEL_REL: f"sandbox/cand/c{n}.py"}})
    (repo / "sandbox/plan.yaml").write_text(yaml.safe_dump({"tries": tries}))
    return [t["optimization"] for t in tries]


def job(repo, plan: list[int], runs: list[dict], budget_s: float, recheck_run_s: float = P_S):
    """One batch job over the entries ``plan``; a re-check run takes ``recheck_run_s`` on the clock."""
    write_plan(repo, plan)
    clock = FakeClock()
    stages = simulated_op(clock, runs, reference(repo))
    stages.on_stage = lambda name, tag, commit: setattr(
        clock, "t", clock.t + (C_S if name == "correctness" else recheck_run_s if "confirm" in tag else P_S))
    return batch(repo=repo, plan_path=repo / "sandbox/plan.yaml", budget_s=budget_s, stages=stages, now=clock), stages


@pytest.fixture(scope="module", params=[3.0, 0.0], ids=["settled-after-1", "needed-3"])
def _primed(request, tmp_path_factory):
    """A session whose log holds two slower tries (no re-check) and two borderline ones (a re-check
    each): with ``settle_sd`` 3 (the default) their re-checks settled after one pair, with 0 they ran 3."""
    repo = build_tilegym_like_repo(tmp_path_factory.mktemp("primed"))
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    allow_no_gpu(repo)
    edit_session(repo, thresholds={"settle_sd": request.param})
    runs = [BASE, {"a": 1.004, "b": 2.01}, {"a": 0.996, "b": 1.99}]
    assert baseline(repo=repo, repeats=3, stages=simulated_op(FakeClock(), runs)).exit_code == 0
    for n, candidate in ((1, SLOWER), (2, SLOWER), (3, BORDERLINE), (4, BORDERLINE)):
        done, _ = job(repo, [n], [candidate, BASE], budget_s=10_000)
        assert [e["decision"] for e in done.data["entries"]] == ["revert" if candidate is SLOWER else "keep"]
    needed = [p.pairs for p in past_rechecks(rows(repo))]
    assert needed == ([1, 1] if request.param else [3, 3]), needed
    return repo, request.param


@pytest.fixture
def primed(_primed, tmp_path):
    repo, settle_sd = _primed
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy, symlinks=True)
    return copy, settle_sd


def test_a_re_check_today_s_floor_defers_runs_when_re_checks_here_settled_after_one_pair(primed, capsys):
    repo, settle_sd = primed
    # Correctness and perf end at 40 s of 115: 75 s are left. Today's floor (3 pairs of the one
    # test in doubt at the perf run's speed) is 90 s; one pair as measured here (two 30 s runs) is 60 s.
    assert budget_mod.recheck_floor_s(P_S, tests_in_doubt=1, tests_run=2, min_pairs=3) == pytest.approx(90.0)
    done, stages = job(repo, [5], [BORDERLINE, BASE], budget_s=115)
    (entry,) = done.data["entries"]
    confirm_runs = [tag for _, tag, _ in stages.calls if "confirm" in tag]
    if settle_sd:
        assert (entry["decision"], entry["cut"]) == ("keep", None), entry
        assert confirm_runs == ["5-confirm1-base", "5-confirm1-cand"]
        assert rows(repo)[-1]["decision"]["settled_after"] == 1
        # Its price is said before it starts, to set against the row's timings.recheck_s.
        assert ("the re-check takes about 60 s (1 of 2 perf tests in doubt; re-checks here settled after 1 pair, "
                "so 1 pair; 15 s start-up a run); 75 s left") in capsys.readouterr().err
    else:
        assert entry["cut"] and not confirm_runs, "3 pairs as measured here (180 s) do not fit 75 s: not started"
        assert ("it needs about 180 s (1 of 2 perf tests in doubt; re-checks here settled after 3 pairs, "
                "so 3 pairs") in entry["cut"]
        assert rows(repo)[-1]["crash_class"] == "interrupted" and "next job" in done.text
        # The next job of the same length passes it over, saying what its price rests on.
        done, stages = job(repo, [5], [BORDERLINE, BASE], budget_s=115)
        assert done.data["not_started"] == ["idea 5"] and not stages.calls
        assert "(the re-check: the slow end of the 2 re-check(s) timed here)" in done.text
    assert_settled(repo)


@pytest.mark.parametrize("_primed", [3.0], ids=["settled-after-1"], indirect=True)
def test_a_re_check_longer_than_its_estimate_is_cut_at_the_budget_s_end_with_no_verdict_and_nothing_lost(primed):
    repo, settle_sd = primed
    assert settle_sd, "the estimate is optimistic where past re-checks settled early"
    # Priced at 60 s as before, but this job's re-check runs take 50 s: the candidate's run of the
    # first pair would end at 140 s of 115. The budget's end cuts it; no verdict on one base run.
    done, stages = job(repo, [5], [BORDERLINE, BASE], budget_s=115, recheck_run_s=50.0)
    (entry,) = done.data["entries"]
    assert entry["cut"] and "ran out during the perf run confirm1" in entry["cut"]
    row = rows(repo)[-1]
    assert (row["status"], row["crash_class"]) == ("crash", "interrupted") and "not a verdict" in row["reason"]
    assert "decision" not in row and (repo / row["patch"]).exists(), "the change is kept in its patch"
    assert "# candidate 5" in (repo / row["patch"]).read_text()
    assert_settled(repo)
    # The next job, long enough, decides it.
    done, _ = job(repo, [5], [BORDERLINE, BASE], budget_s=1000)
    assert [(e["decision"], e["cut"]) for e in done.data["entries"]] == [("keep", None)]
    assert_settled(repo)
