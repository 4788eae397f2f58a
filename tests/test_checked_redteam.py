"""Red team of checked timed calls (issue 39 items 1-2), on the CPU: the SIMULATED TileGym-shaped
silu_and_mul of tests/fixtures_checked.py, timed by TileGym-shaped timers whose test file is never
edited. Each perf-only cheat must end not kept by ``try``, with a reason naming the case and the
timed call; the honest change is the control."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_checked import add_checked_op, set_cheat
from fixtures_repo import allow_no_gpu, git, tilegym_like_repo  # noqa: F401

from cutile_perf.cli import main


def cli(capsys, repo: Path, command: str, *args: str) -> tuple[int, dict]:
    code = main([command, "--repo", str(repo), "--json", *args])
    out = capsys.readouterr().out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {})


@pytest.fixture
def checked_session(tilegym_like_repo, capsys):
    repo = add_checked_op(tilegym_like_repo)
    code, data = cli(capsys, repo, "init", "--kernel", "silu_and_mul", "--timeout", "120")
    assert code == 0, data
    allow_no_gpu(repo)
    code, data = cli(capsys, repo, "baseline", "--repeats", "2")
    assert code == 0, data
    return repo


@pytest.mark.parametrize("cheat", ["count", "profiler", "big", "huge"])
def test_perf_only_cheat_is_not_kept_and_names_case_and_call(checked_session, capsys, cheat):
    repo = checked_session
    base = git(repo, "rev-parse", "HEAD").strip()
    set_cheat(repo, cheat)
    code, data = cli(capsys, repo, "try", f"cheat {cheat}")
    assert data.get("decision") != "keep", data
    assert git(repo, "rev-parse", "HEAD").strip() == base
    assert "wrong-when-timed" in json.dumps(data), data
    assert "call" in data.get("reason", "") and "case" in data.get("reason", ""), data
    if cheat == "huge":  # found through the summary of a result too large to save whole
        assert "512" in data["reason"] and ("sums differ" in data["reason"] or "sampled" in data["reason"]), data
    # the mismatching calls' inputs stay beside the log as the evidence
    assert list((repo / "sandbox/runs").glob("1-*perf.checked/*")), sorted((repo / "sandbox/runs").iterdir())


def test_honest_change_is_not_flagged(checked_session, capsys):
    repo = checked_session
    path = repo / "src/fakegym/ops/cutile/silu_and_mul.py"
    path.write_text(path.read_text() + "\n# honest: a comment-only change\n")
    code, data = cli(capsys, repo, "try", "honest comment")
    assert "wrong-when-timed" not in json.dumps(data) and "implausible" not in data.get("reason", ""), data
    # every capture was judged and deleted: timed calls' inputs and outputs can fill a disk
    runs = repo / "sandbox/runs"
    assert list(runs.glob("*-reference.log")), sorted(runs.iterdir())  # the calls were checked
    # every perf case's call, the summarized 512 x 16384 one too (``child.tensor_summary``)
    row = json.loads((repo / "sandbox/experiments.jsonl").read_text().strip().splitlines()[-1])
    assert row["checked"].endswith(" ok, 0 mismatch, 0 unchecked"), row
    # each case's copy roofline, for a report's "% of roofline" (benchmarks/tilegym_campaign.py)
    assert set(row["copy_floor_ms"]) == set(row["shapes"]) and all(v > 0 for v in row["copy_floor_ms"].values()), row
    assert not list(runs.glob("*.checked")), sorted(runs.glob("*.checked"))


# Verdicts about the machine, not the change: the control cannot show a keep through them.
MACHINE_NOISE = ("baseline-drift", "unstable")


@pytest.fixture
def event_timer(monkeypatch):
    """The session timed by the SIMULATED event-pair timer (``CUPTI=0``): a sample is the call alone,
    not a profiler session around it, so a call that does no work records what it costs."""
    monkeypatch.setenv("CUPTI", "0")


def test_without_the_check_the_count_cheat_is_kept(event_timer, checked_session, capsys, monkeypatch):
    """The control of the defence itself: with checked timed calls switched off
    (``CUTILE_PERF_UNCHECKED=1``, the documented A/B knob) the same cheat is kept as faster, so the
    test above fails without the check; and ``verify``, with the check on, refuses the kept row.
    Timed by the event-pair timer: under the simulated CUPTI timer the cheat's samples are mostly a
    profiler session's set-up, whose cost differs from process to process, and the candidate was
    then rightly called unstable (-88.7 % to -83.9 % on one case, a quiet 2-core machine). Even so,
    beside another test worker one run in three was reverted for noise: the control retries, as a
    hostile agent would (a change reverted before needs interleaved evidence to be kept, which the
    re-check gives), since what it shows is that the cheat *can* be kept without the check. In a
    full fresh-clone run (-n auto, 2 cores) all three were once reverted as baseline-drift; then the
    test skips, saying so, and fails on any other reason."""
    monkeypatch.setenv("CUTILE_PERF_UNCHECKED", "1")
    noise = []
    for attempt in range(3):  # as an agent would retry; a busy 2-core machine may call one run unstable
        set_cheat(checked_session, "count")
        code, data = cli(capsys, checked_session, "try", f"cheat count, unchecked, attempt {attempt + 1}")
        if data.get("decision") == "keep":
            break
        reason = str(data.get("reason", ""))
        assert reason.startswith(MACHINE_NOISE), reason  # reverted for anything but noise: the control fails
        noise.append(reason)
    else:
        # The judge refused every attempt for the machine's noise (a baseline recorded under other
        # load drifts, as in a full -n auto run on 2 cores): no keep to show, and no keep to verify.
        pytest.skip(f"too noisy here to show the control: {noise[-1][:300]}")
    # what slipped into an old session: ``verify`` re-judges it with checked timing on
    monkeypatch.delenv("CUTILE_PERF_UNCHECKED")
    code, data = cli(capsys, checked_session, "verify")
    assert code == 1 and "wrong-when-timed" in json.dumps(data), data


def test_init_says_which_perf_shapes_no_correctness_test_covers(tilegym_like_repo, capsys):
    repo = add_checked_op(tilegym_like_repo)
    code, data = cli(capsys, repo, "init", "--kernel", "silu_and_mul", "--timeout", "120")
    assert code == 0, data
    uncovered = data["uncovered_perf_cases"]
    assert any("16384" in case for case in uncovered) and any("512" in case for case in uncovered), uncovered


def test_a_memo_cheat_with_right_values_is_refused_by_the_floor(event_timer, checked_session, capsys):
    """``memo`` returns the result of an earlier call on the same input: right values, no work, so
    no comparison of values can see it. The floor can: its big cases record less time than moving
    their tensors' bytes at the copy bandwidth the reference child measured (the SIMULATED device's:
    host memory) takes, by some 50x here."""
    repo = checked_session
    base = git(repo, "rev-parse", "HEAD").strip()
    set_cheat(repo, "memo")
    code, data = cli(capsys, repo, "try", "cheat memo")
    assert data.get("decision") != "keep", data
    assert git(repo, "rev-parse", "HEAD").strip() == base
    assert "implausible" in data.get("reason", "") and "below its floor" in data["reason"], data
