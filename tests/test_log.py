"""The experiments log: durable appends, a kill mid-write, and which entry is the baseline."""
from __future__ import annotations

import json

import pytest

from cutile_perf.judge.rules import current_baseline
from cutile_perf.store.history import History
from cutile_perf.store.log import shape_medians
from cutile_perf.store.log import Snapshot, anchor_of, append_entry, check_chain, validate_entry


def next_iteration(entries):
    return History(tuple(entries)).next_iteration()


def entry(iteration: int, status: str = "keep", tier: str | None = None, **extra) -> dict:
    return {
        "iteration": iteration,
        "optimization": "baseline" if iteration == 0 else f"change {iteration}",
        "status": status,
        "correctness": "PASS" if status != "crash" else "FAIL",
        "latency_ms": None if status == "crash" else 0.3,
        "shapes": {"262144-1024": {"median": 0.28, "runs": [0.28, 0.281]}},
        "decision": None if tier is None else {"tier": tier, "rebaseline": tier in ("new-baseline",)},
        **extra,
    }


def test_append_then_read_round_trips(tmp_path):
    path = tmp_path / "sandbox" / "experiments.jsonl"
    for e in (entry(0), entry(1, tier="new-baseline"), entry(2, "crash", crash_class="compile")):
        append_entry(path, e)
    rows = Snapshot.read(path).contents.entries
    assert [{k: v for k, v in r.items() if k != "prev"} for r in rows] == [
        entry(0), entry(1, tier="new-baseline"), entry(2, "crash", crash_class="compile")]
    assert all(json.loads(line) for line in path.read_text().splitlines())  # one object per line


def test_rows_are_hash_chained_and_a_hand_edit_or_truncation_is_located(tmp_path):
    path = tmp_path / "experiments.jsonl"
    for e in (entry(0), entry(1, tier="new-baseline"), entry(2, "crash", crash_class="compile")):
        append_entry(path, e)
    anchor = anchor_of(path)
    assert check_chain(path, anchor) is None
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1].replace('"latency_ms": 0.3', '"latency_ms": 0.1') + lines[2])
    assert "line 3 does not follow line 2" in check_chain(path, anchor)
    path.write_text(lines[0] + lines[1])
    assert "truncated after line 2" in check_chain(path, anchor)
    path.write_text("".join(lines) + lines[2])
    assert "line 4" in check_chain(path, anchor)


def test_truncated_last_line_is_skipped_and_reported(tmp_path):
    path = tmp_path / "experiments.jsonl"
    append_entry(path, entry(0))
    with open(path, "a") as fh:
        fh.write(json.dumps(entry(1))[:25])  # kill -9 in the middle of the second write
    contents = Snapshot.read(path).contents
    assert [e["iteration"] for e in contents.entries] == [0]
    assert contents.truncated_tail is not None and contents.truncated_tail.startswith('{"iteration": 1')


def test_append_after_a_truncated_line_does_not_lose_the_new_entry(tmp_path):
    # The bug this pins: appending straight after a cut line glues the new entry onto the fragment.
    path = tmp_path / "experiments.jsonl"
    append_entry(path, entry(0))
    with open(path, "a") as fh:
        fh.write('{"iteration": 1, "optim')
    append_entry(path, entry(2, "revert", tier="regression"))
    contents = Snapshot.read(path).contents
    assert [e["iteration"] for e in contents.entries] == [0, 2]
    assert contents.truncated_tail is None and contents.skipped == [(2, '{"iteration": 1, "optim')]


def test_missing_log_is_empty(tmp_path):
    assert Snapshot.read(tmp_path / "none.jsonl").contents.entries == []
    assert next_iteration([]) == 0


@pytest.mark.parametrize("bad, field", [
    ({"iteration": -1}, "iteration"), ({"iteration": "1"}, "iteration"), ({"status": "kept"}, "status"),
    ({"correctness": "ok"}, "correctness"), ({"latency_ms": float("nan")}, "latency_ms"),
    ({"latency_ms": 0}, "latency_ms"), ({"optimization": " "}, "optimization"),
])
def test_validate_entry_names_the_bad_field(bad, field, tmp_path):
    with pytest.raises(ValueError, match=field):
        validate_entry({**entry(1), **bad})
    with pytest.raises(ValueError):
        append_entry(tmp_path / "log.jsonl", {**entry(1), **bad})
    assert not (tmp_path / "log.jsonl").exists()


def test_current_baseline_skips_reverts_crashes_and_no_change_keeps():
    entries = [entry(0), entry(1, "revert", "regression"), entry(2, tier="new-baseline"),
               entry(3, "crash"), entry(4, tier="no-change")]
    assert current_baseline(entries)["iteration"] == 2
    assert current_baseline(entries[:2])["iteration"] == 0
    assert current_baseline([entry(1, "revert", "regression")]) is None
    # An older log without the rebaseline flag: the tier decides.
    assert current_baseline([entry(0), {**entry(1), "decision": {"tier": "keep-lower-priority"}}])["iteration"] == 1


def test_next_iteration_and_shape_medians():
    assert next_iteration([entry(0), entry(1), entry(5, "crash")]) == 6
    assert shape_medians(entry(0)) == {"262144-1024": 0.28}
    assert shape_medians(entry(3, "crash") | {"shapes": None}) == {}
