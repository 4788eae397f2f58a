"""``verify`` re-judges a kept row through the loop's own judge (issue 39 item 5, issue 40 item 2).

The rows are made by ``try_change`` with scripted stages (``loop.stages.ScriptedStages``), then
``verify`` runs with scripted stages of its own: what an honest device measures when it
re-measures the two commits. The old ``verify`` compared the rows' recorded medians (the
candidate's single run) with its measured interval plus a gate; these rows pass that rule and
still were kept on a verdict nobody can reproduce.
"""
from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
from fixtures_repo import KERNEL_REL, allow_no_gpu, build_tilegym_like_repo

from cutile_perf.cli import main
from cutile_perf.commands.verify import verify
from cutile_perf.judge import recheck
from cutile_perf.judge import verdict as verdict_mod
from cutile_perf.judge.verdict import Stage
from cutile_perf.loop.baseline import baseline
from cutile_perf.store.history import History
from cutile_perf.loop.iteration import try_change
from scripted_stages import ScriptedStages
from cutile_perf.store import git_ops
from cutile_perf.store import session as session_mod

TESTS = frozenset({"tests/ops/test_rms_norm.py::test_op[cutile]"})
KERNEL = "rms_norm_kernel"
BASE = {"a": 1.0, "b": 2.0}


def perf(medians: dict[str, float], **fields) -> Stage:
    return Stage("perf", shapes=dict(medians), test_ids={c: f"t::test_perf[{c}]" for c in medians},
                 kernel_names={c: KERNEL for c in medians}, **fields)


def scaled(factor: float) -> dict[str, float]:
    return {c: v * factor for c, v in BASE.items()}


def scripted(repo, candidate: list[Stage], base: list[Stage]) -> ScriptedStages:
    """Runs of the session's first baseline commit ("base") and of any other commit ("candidate")."""
    history = History.open(session_mod.load(repo), git_ops.open_repo(repo))
    return ScriptedStages({("correctness", "candidate"): [Stage("correctness", passed=TESTS)],
                           ("perf", "candidate"): candidate, ("perf", "base"): base},
                          reference_commit=history.first()["commit"], defined={KERNEL})


@pytest.fixture(scope="module")
def _template(tmp_path_factory):
    repo = build_tilegym_like_repo(tmp_path_factory.mktemp("verify"))
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    allow_no_gpu(repo)
    runs = [perf(BASE), perf({"a": 1.004, "b": 2.01}), perf({"a": 0.996, "b": 1.99})]
    stages = ScriptedStages({("correctness", "candidate"): [Stage("correctness", passed=TESTS)],
                             ("perf", "candidate"): runs}, defined={KERNEL})
    assert baseline(repo=repo, repeats=3, stages=stages).exit_code == 0
    return repo


@pytest.fixture
def repo(_template, tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(_template, copy, symlinks=True)
    return copy


def kept(repo, optimization: str, stages: ScriptedStages) -> dict:
    path = repo / KERNEL_REL
    path.write_text(path.read_text() + f"\n# {optimization}\n")
    row = try_change(repo, optimization, stages=stages).row
    assert row["status"] == "keep", row["reason"]
    return row


def verify_with(repo, candidate: dict[str, float], base: dict[str, float] = BASE, **fields):
    stages = scripted(repo, [perf(candidate, **fields)], [perf(base)])
    return verify(repo=repo, older=None, newer=None, pairs=3, stages=stages)


def test_an_honest_keep_verifies_with_its_geomean_and_tier(repo):
    row = kept(repo, "twice as fast", scripted(repo, [perf(scaled(0.5))], [perf(BASE)]))
    assert row["decision"]["tier"] == "new-baseline"
    out = verify_with(repo, scaled(0.5))
    assert out.exit_code == 0 and out.data["verified"], out.text
    assert out.data["measured"]["tier"] == out.data["recorded"]["tier"] == "new-baseline"
    assert out.data["measured"]["geomean_change"] == pytest.approx(-0.5, abs=0.01)


def test_a_keep_won_on_slow_baseline_runs_is_not_verified(repo, monkeypatch):
    """Issue 39: a co-tenant slowed the re-check's baseline runs and a 1 % slower change was kept as
    "new-baseline -37 %" by a loop without the baseline cross-check. Its single run (what the row
    records as its medians) was honest, so the old verify, which compared recorded medians,
    agreed. The re-judged verdict on a quiet device is not "faster"."""
    monkeypatch.setattr(verdict_mod, "drifted_pairs", lambda *a, **k: {})  # the loop before the cross-check
    monkeypatch.setattr(recheck, "unstable", lambda *a, **k: None)  # and before its single run had to agree
    row = kept(repo, "one percent slower", scripted(repo, [perf(scaled(1.01))], [perf(scaled(1.6))]))
    assert row["decision"]["tier"] == "new-baseline" and row["decision"]["geomean_change"] < -0.3
    monkeypatch.undo()
    out = verify_with(repo, scaled(1.01))
    assert out.exit_code == 1 and not out.data["verified"], out.text
    assert out.data["measured"]["tier"] != "new-baseline"
    assert "tier" in out.data["not_reproduced"] and "geomean" in out.data["not_reproduced"], out.text


def test_a_keep_whose_tier_does_not_reproduce_is_not_verified(repo):
    """A baseline run a little slow (inside the cross-check's gate) made a 3 % gain "new-baseline
    -5.8 %". The single run recorded 0.97, which re-measures exactly: the old verify agreed. The
    re-judged verdict is "keep-lower-priority"."""
    row = kept(repo, "three percent faster", scripted(repo, [perf(scaled(0.97))], [perf(scaled(1.03))]))
    assert row["decision"]["tier"] == "new-baseline", row["reason"]
    out = verify_with(repo, scaled(0.97))
    assert out.exit_code == 1 and not out.data["verified"], out.text
    assert (out.data["recorded"]["tier"], out.data["measured"]["tier"]) == ("new-baseline", "keep-lower-priority")
    assert "tier" in out.data["not_reproduced"]


def test_a_timed_call_that_mismatches_when_verify_re_measures_is_not_verified(repo):
    """Checked timed calls count in verify as in the loop: the old verify read only the medians."""
    kept(repo, "twice as fast", scripted(repo, [perf(scaled(0.5))], [perf(BASE)]))
    mismatch = ({"status": "mismatch", "case": "a", "timer": "cuda-event", "ordinal": 7, "reason": "max abs diff 3.0"},)
    out = verify_with(repo, scaled(0.5), checks=mismatch)
    assert out.exit_code == 1 and not out.data["verified"], out.text
    assert "checked timed calls" in out.data["not_reproduced"] and "wrong-when-timed" in out.text


def test_baseline_runs_that_disagree_with_their_recorded_medians_decide_nothing(repo):
    """The baseline cross-check: verify on a busy device says so instead of a verdict on its runs."""
    kept(repo, "twice as fast", scripted(repo, [perf(scaled(0.5))], [perf(BASE)]))
    out = verify_with(repo, scaled(0.5), base=scaled(1.5))
    assert out.exit_code == 1 and not out.data["verified"], out.text
    assert out.data["measured"]["tier"] == "baseline-drift"
    assert "baseline cross-check" in out.data["not_reproduced"], out.text
