"""node.tasks: claimed by rename once, recorded once, a dead worker's claim re-queued or lost (no GPU needed)."""
from __future__ import annotations

import json
import threading

import pytest

from cutile_perf.node.tasks import LOST, TaskDir


def test_a_task_is_claimed_by_one_worker_only(tmp_path):
    folder = TaskDir(tmp_path)
    for i in range(40):
        folder.submit(f"t{i:02d}", {"i": i})
    claims: dict[str, list[str]] = {f"w{n}": [] for n in range(4)}

    def drain(worker):
        while (task := folder.claim(worker)) is not None:
            claims[worker].append(task["id"])

    threads = [threading.Thread(target=drain, args=(w,)) for w in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for ids in claims.values() for i in ids]
    assert sorted(every) == [f"t{i:02d}" for i in range(40)]  # each once: none twice, none lost


def test_a_result_is_recorded_once_and_a_second_one_is_refused(tmp_path):
    folder = TaskDir(tmp_path)
    folder.submit("a", {})
    folder.claim("w0")
    assert folder.finish("w0", "a", {"status": "ok", "result": 1}) is True
    assert folder.finish("w1", "a", {"status": "ok", "result": 2}) is False
    assert folder.results()["a"]["result"] == 1 and folder.results()["a"]["worker"] == "w0"
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_dead_workers_claim_goes_back_to_the_queue_with_its_attempt_counted(tmp_path):
    folder = TaskDir(tmp_path)
    folder.submit("a", {"x": 1})
    folder.claim("w0")
    assert folder.release("w0", max_attempts=2) == ["a"]
    task = folder.claim("w1")
    assert task == {"id": "a", "payload": {"x": 1}, "attempt": 2}


def test_past_max_attempts_a_dead_workers_claim_is_recorded_lost_not_dropped(tmp_path):
    folder = TaskDir(tmp_path)
    folder.submit("a", {}, attempt=2)
    folder.claim("w0")
    assert folder.release("w0", max_attempts=2) == []
    assert folder.results()["a"]["status"] == LOST and folder.waiting() == 0


def test_a_claim_whose_result_is_already_recorded_is_not_requeued(tmp_path):
    # The worker died between writing done/ and dropping its claim: re-running it would record twice.
    folder = TaskDir(tmp_path)
    folder.submit("a", {})
    folder.claim("w0")
    (folder.done / "a.json").write_text(json.dumps({"id": "a", "status": "ok"}))
    assert folder.release("w0", max_attempts=5) == []
    assert folder.waiting() == 0 and not list((folder.claimed / "w0").iterdir())


@pytest.mark.parametrize("bad", ["", "../x", ".hidden", "a/b"])
def test_a_task_id_is_a_plain_file_name(tmp_path, bad):
    with pytest.raises(ValueError, match="plain file name"):
        TaskDir(tmp_path).submit(bad, {})


def test_a_claimed_task_is_not_offered_to_another_worker(tmp_path):
    # The claim moves the file out of the queue: a second worker (another process: another TaskDir) finds nothing.
    TaskDir(tmp_path).submit("a", {})
    assert TaskDir(tmp_path).claim("w0")["id"] == "a"
    assert TaskDir(tmp_path).claim("w1") is None
    assert (tmp_path / "claimed" / "w0" / "a.json").exists()
