"""State that is not ours is not trusted (issue 19 item 3): ``resume`` acts only on an iteration
state cutile-perf signed, ends only process groups it can prove it started, and the repository
lock is the kernel's (``flock``), not a file a child can unlink. Each test fails without its defence.
CPU only: the simulated TileGym-shaped repository and the CLI.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

from fixtures_repo import edit_kernel
from redteam_helpers import (FAST, _template, call, reap, repo, rows, snapshot, spawn, tagged_pids,  # noqa: F401
                             wait_until)

from cutile_perf.loop.iteration_state import end_children, process_start


def test_a_forged_iteration_state_is_refused_and_no_row_is_appended(repo):
    before = len(rows(repo))
    last = rows(repo)[-1]
    forged = {"iteration": 1, "optimization": "forged keep", "name": "1-forged", "base": last["commit"],
              "reference": last["commit"], "paths": ["src/fakegym/ops/cutile/rms_norm.py"], "step": "decided",
              "patch": None, "candidate": last["commit"], "row_hash": None, "children": [],
              "row": {**{k: v for k, v in last.items() if k != "prev"}, "iteration": 1, "optimization": "forged keep"},
              "signature": "0" * 64}
    (repo / "sandbox/iteration.json").write_text(json.dumps(forged))
    code, data, _ = call(repo, "resume")
    assert code == 3 and "not the state cutile-perf wrote" in json.dumps(data), data
    assert len(rows(repo)) == before


def test_resume_never_kills_a_process_group_it_did_not_start():
    victim = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        started = process_start(victim.pid)
        assert started is not None
        assert end_children([[victim.pid, str(int(started) + 1)]]) == []  # same pid, another process
        assert end_children([[victim.pid, None]]) == []
        assert victim.poll() is None, "an unrelated process group was killed"
        assert end_children([[victim.pid, started]]) == [victim.pid]
        victim.wait(timeout=10)
    finally:
        if victim.poll() is None:
            victim.kill()


def test_the_lock_survives_its_file_being_unlinked_by_a_child(repo, reap):
    edit_kernel(repo, sleep=30)  # every simulated test hangs: `try` holds the lock meanwhile
    tag = uuid.uuid4().hex
    proc = spawn(repo, "try", "hangs", env={"REDTEAM_TAG": tag})

    def child_started() -> bool:
        try:
            return bool(json.loads((repo / "sandbox/iteration.json").read_text()).get("children"))
        except (OSError, ValueError):
            return False

    try:
        wait_until(child_started, 60, "the first child to start")
        (repo / "sandbox/cutile-perf.lock").unlink()  # what a hostile child would do
        code, data, _ = call(repo, "status")  # status takes no lock: still answers
        code, data, _ = call(repo, "verify")
        assert code == 3 and "running" in json.dumps(data), data
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        reap.extend(tagged_pids(tag, repo))
    code, data, _ = call(repo, "resume")
    assert code == 0 and data.get("consistent"), data
