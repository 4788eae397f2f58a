"""A kill *inside* each window of the iteration transaction, not only between its steps, ends in a
state ``resume`` repairs: one row per iteration, the anchor matching the log, HEAD on the kept commit,
the change saved, and the next ``try`` accepted.

The windows (``knobs.kill_point``): the row appended but the anchor not yet moved (the kill that
used to brick a session: every later command said the log was not the one cutile-perf wrote), the
anchor moved but the step not yet persisted, and a revert's patch saved but the branch not yet reset.
CPU only: the simulated TileGym-shaped repository of ``fixtures_repo`` and the CLI in a subprocess.
"""
from __future__ import annotations

import uuid

import pytest
from fixtures_repo import edit_kernel
from redteam_helpers import (FAST, SLOW, _template, append_to_kernel, call, head, killed_by, reap, repo,  # noqa: F401
                             resume_and_check, rows, snapshot, spawn)

WINDOWS = ("record:appended", "record:anchored", "revert:patch-saved")


@pytest.mark.parametrize("window", WINDOWS)
def test_kill_inside_a_window_of_a_reverted_try_is_repaired_by_resume(repo, reap, window):
    before = snapshot(repo)
    edit_kernel(repo, latency=SLOW)
    append_to_kernel(repo, "# ATTACK window")
    tag = uuid.uuid4().hex
    proc = spawn(repo, "try", f"killed inside {window}",
                 env={"CUTILE_PERF_TEST_KILL_AT": window, "CUTILE_PERF_TEST_SIGNAL": "KILL", "REDTEAM_TAG": tag})
    _out, err = proc.communicate(timeout=300)
    assert killed_by(proc.returncode, "KILL"), f"exit {proc.returncode}, not killed in {window}: {err[-500:]}"
    row = resume_and_check(repo, before, tag, reap, marker="# ATTACK window")
    assert row["status"] == "revert", row
    # The session is not bricked: the status is clean and the next try runs.
    code, data, _ = call(repo, "status")
    assert code == 0 and not data.get("log_broken"), data
    edit_kernel(repo, latency=FAST)
    code, data, _ = call(repo, "try", "faster after the repair")
    assert code == 0 and data["decision"] == "keep", data


@pytest.mark.parametrize("window", WINDOWS[:2])
def test_kill_inside_a_window_of_a_kept_try_keeps_it_once(repo, reap, window):
    edit_kernel(repo, latency=FAST)
    proc = spawn(repo, "try", f"faster, killed inside {window}",
                 env={"CUTILE_PERF_TEST_KILL_AT": window, "CUTILE_PERF_TEST_SIGNAL": "KILL"})
    proc.communicate(timeout=300)
    assert killed_by(proc.returncode, "KILL"), proc.returncode
    code, data, _ = call(repo, "resume")
    assert code == 0 and data.get("consistent"), data
    kept = [r for r in rows(repo) if r["iteration"] == 1]
    assert len(kept) == 1 and kept[0]["status"] == "keep", kept
    assert head(repo) == kept[0]["commit"]
    code, data, _ = call(repo, "status")
    assert code == 0 and not data.get("log_broken"), data


def test_a_row_appended_behind_the_harness_is_still_refused(repo):
    """The repair accepts only the row the interrupted iteration itself was recording: a line
    appended by anything else, with no iteration waiting, is still tampering."""
    import json

    log = repo / "sandbox/experiments.jsonl"
    last = json.loads(log.read_text().splitlines()[-1])
    from cutile_perf.store.log import append_entry

    append_entry(log, {**{k: v for k, v in last.items() if k != "prev"}, "iteration": 7, "optimization": "forged"})
    edit_kernel(repo, latency=FAST)
    code, data, _ = call(repo, "try", "after a forged row")
    assert code == 3 and "not the log cutile-perf wrote" in json.dumps(data), data
