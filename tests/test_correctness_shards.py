"""Correctness in several pytest children at once (``init --correctness-jobs N``), on CPU.

The split rule is a pure function (``runreport.merge_shards``); the rest runs through the real CLI
on the SIMULATED TileGym-shaped repository of ``fixtures_repo`` (its fake tests need no GPU).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_repo import allow_no_gpu, build_tilegym_like_repo, edit_kernel, edit_session
from redteam_helpers import FAST, append_to_kernel, assert_not_kept_nothing_lost, call, rows, snapshot

from cutile_perf import knobs
from cutile_perf.child import runreport
from cutile_perf.errors import BadEnvValue

# --- the split rule -------------------------------------------------------------------------------

IDS = ["t.py::a", "t.py::b", "t.py::c"]


def _share(index: int, count: int, ids=IDS, *, ended: bool = True, passed=None) -> runreport.RunReport:
    mine = sorted(ids)[index::count]
    return runreport.RunReport(
        outcomes={n: "passed" for n in (mine if passed is None else passed)}, ended=ended, exitstatus=0,
        shard={"index": index, "count": count, "selected": len(ids), "digest": runreport.ids_digest(ids),
               "mine": len(mine)})


def test_shares_of_one_selection_merge_into_one_report():
    merged, problem = runreport.merge_shards([_share(i, 3) for i in range(3)])
    assert problem is None and merged.ended and merged.passed() == set(IDS)


def test_an_empty_share_is_part_of_a_sound_split():
    merged, problem = runreport.merge_shards([_share(i, 4) for i in range(4)])  # 3 tests, 4 children
    assert problem is None and merged.passed() == set(IDS)


def _ran_none_of_its_share() -> runreport.RunReport:
    report = _share(1, 2)
    report.shard = {**report.shard, "mine": 0}
    return report


@pytest.mark.parametrize("case, shares, why", [
    ("one share run twice, one never", [_share(0, 3), _share(0, 3), _share(2, 3)], "shares 0..k-1 once each"),
    ("children selected different tests", [_share(0, 2), _share(1, 2, IDS[:2])], "did not select the same tests"),
    ("a child split another way", [_share(0, 2), _share(1, 3)], "did not select the same tests"),
    ("a share left unrun", [_share(0, 2), _ran_none_of_its_share()], "did not cover the selected tests"),
])
def test_a_split_that_does_not_add_up_is_named(case, shares, why):
    _merged, problem = runreport.merge_shards(shares)
    assert problem is not None and why in problem, case


def test_a_child_that_ended_without_sharding_is_no_evidence_and_one_that_died_has_no_end():
    unsharded = runreport.RunReport(outcomes={"t.py::a": "passed"}, ended=True)
    assert "without reporting its share" in runreport.merge_shards([_share(0, 2), unsharded])[1]
    merged, _problem = runreport.merge_shards([_share(0, 2), _share(1, 2, ended=False)])
    assert not merged.ended  # the judge then says: no end marker, incomplete tests


@pytest.mark.parametrize("value, expected", [("", None), ("0/2", (0, 2)), ("2/3", (2, 3))])
def test_shard_variable_is_read_strictly(monkeypatch, value, expected):
    monkeypatch.setenv("CUTILE_PERF_SHARD", value)
    assert knobs.shard() == expected


@pytest.mark.parametrize("value", ["2/2", "-1/2", "a/b", "1", "0/0"])
def test_a_bad_shard_variable_is_an_error_not_a_silent_full_run(monkeypatch, value):
    monkeypatch.setenv("CUTILE_PERF_SHARD", value)
    with pytest.raises(BadEnvValue):
        knobs.shard()


# --- through the CLI on the simulated repo ----------------------------------------------------------

# Every backend's test_op: three correctness tests, so three children get one each.
ALL_TEST_OPS = '{python} -m pytest {test} -k "test_op" -q'


def _sharded_session(tmp_path: Path, jobs: int) -> Path:
    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--timeout", "60", "--correctness-jobs", str(jobs))
    assert code == 0, data
    allow_no_gpu(repo)
    edit_session(repo, correctness_cmd=ALL_TEST_OPS)
    code, data, _ = call(repo, "baseline", "--repeats", "2")
    assert code == 0, data
    return repo


def _shard_reports(repo: Path, iteration_tag: str) -> list[list[dict]]:
    runs = repo / "sandbox" / "runs"
    found = sorted(runs.glob(f"*{iteration_tag}*-correctness.shard*.report.jsonl"))
    return [[json.loads(line) for line in path.read_text().splitlines()] for path in found]


@pytest.mark.slow
def test_three_correctness_children_run_each_test_once_and_a_faster_kernel_is_kept(tmp_path):
    repo = _sharded_session(tmp_path, 3)
    edit_kernel(repo, latency=FAST)
    code, data, _ = call(repo, "try", "faster, judged with sharded correctness")
    assert code == 0, data
    row = rows(repo)[-1]
    assert (row["status"], row["correctness"]) == ("keep", "PASS")
    logs = sorted((repo / "sandbox" / "runs").glob("*-correctness.log"))
    text = logs[-1].read_text()
    assert all(f"shard {i} of 3" in text for i in (1, 2, 3)), text[:500]
    reports = _shard_reports(repo, Path(logs[-1].name).stem.rsplit("-correctness", 1)[0])
    ran = [line["nodeid"] for report in reports for line in report if line["type"] == "test"]
    assert len(reports) == 3 and sorted(ran) == sorted(set(ran)) and len(ran) == 3  # each test once


@pytest.mark.slow
def test_a_wrong_kernel_fails_in_whichever_share_runs_it(tmp_path):
    repo = _sharded_session(tmp_path, 2)
    before = snapshot(repo)
    edit_kernel(repo, latency=FAST, behaviour="wrong")
    code, _data, _ = call(repo, "try", "faster but wrong")
    row = assert_not_kept_nothing_lost(repo, before, code)
    assert (row["status"], row["correctness"], row.get("crash_class")) == ("revert", "FAIL", "wrong-result"), row


# Red team: the kernel module is imported while pytest collects, before the plugin splits the
# tests, so it can reach the plugin and change the share its child runs.
STEER_THE_SHARE = '''
# ATTACK steer-the-share
import inspect as _inspect

BEHAVIOUR = "wrong"

for _frame in _inspect.stack():
    _cfg = getattr(_frame.frame.f_locals.get("self"), "config", None)
    if _cfg is not None and hasattr(_cfg, "pluginmanager"):
        _reporter = _cfg.pluginmanager.get_plugin("cutile-perf-run-report")
        if _reporter is not None and _reporter.shard is not None:
            _reporter.shard = (_reporter.shard[1], _reporter.shard[1])  # a share past the end: run nothing
        break
'''


@pytest.mark.slow
@pytest.mark.usefixtures("runtime_defences_only")
def test_a_kernel_that_steers_its_childs_share_is_not_kept(tmp_path):
    repo = _sharded_session(tmp_path, 3)
    before = snapshot(repo)
    edit_kernel(repo, latency=FAST)
    append_to_kernel(repo, STEER_THE_SHARE)
    code, _data, _ = call(repo, "try", "faster (no correctness test runs)")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK steer-the-share")
    assert (row["status"], row.get("crash_class")) == ("crash", "incomplete-tests"), row


def test_correctness_jobs_out_of_range_is_a_one_line_error(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--correctness-jobs", "0")
    assert code == 2 and "--correctness-jobs must be from 1 to 16" in json.dumps(data)
    assert not (repo / "sandbox" / "session.yaml").exists()


@pytest.mark.slow
def test_a_kernel_that_does_not_import_keeps_its_crash_class_when_sharded(tmp_path):
    """A collection error ends every child before the split: the class is the error's, not the split's."""
    repo = _sharded_session(tmp_path, 2)
    before = snapshot(repo)
    append_to_kernel(repo, "import a_module_that_does_not_exist  # ATTACK none, a broken import")
    code, _data, _ = call(repo, "try", "broken import")
    row = assert_not_kept_nothing_lost(repo, before, code)
    assert (row["status"], row.get("crash_class")) == ("crash", "compile"), row


def test_children_started_from_several_threads_are_all_recorded_for_resume(tmp_path):
    """Shards and a pre-started perf child report their process groups from different threads;
    every group must reach iteration.json, or a killed try's resume could leave one running."""
    import threading

    from cutile_perf.loop.iteration_state import STATE_FILE, State

    state = State(tmp_path / STATE_FILE, b"key", 1, "x", "1-x", "base", "ref", ["k.py"])
    threads = [threading.Thread(target=lambda i=i: [state.add_child(i * 100 + j) for j in range(25)])
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert sorted(pgid for pgid, _started in saved["children"]) == sorted(i * 100 + j for i in range(6) for j in range(25))
