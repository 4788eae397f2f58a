"""A perf child saves at most ``checked.capture_limit`` bytes of timed calls (a third of its disk's free
space, within bounds); past it each call is unchecked with the reason (an unbounded capture filled a
64 GB disk during a TileGym baseline; a fixed 4 GB left TileGym's perf-only sizes unchecked)."""
from __future__ import annotations

import pytest

from cutile_perf.child import checked

torch = pytest.importorskip("torch", reason="checked timed calls capture torch tensors")


def _timer(fn, repeats=3):
    for _ in range(repeats):
        fn()
    return 1.0


def test_calls_past_the_capture_limit_are_unchecked_with_the_reason(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(checked, "SETUP", None)
    checked.configure(checked.CAPTURE, tmp_path, lines.append)
    x = torch.ones(1024)  # 4 KB
    monkeypatch.setattr(checked.SETUP, "capture_limit", 3 * 12 * 1024)  # input, sampled and after: 4 KB each
    timer = checked.wrap_timer(_timer, checked.fixed("events", "flushed"), "test timer")
    checked.begin_test("tests/test_op.py::test_perf[1024]")
    for _ in range(5):
        assert timer(lambda: x * 2) == 1.0
    statuses = [line["status"] for line in lines]
    assert statuses[:3] == ["captured"] * 3 and statuses[3:] == ["unchecked"] * 2
    assert "capture limit" in lines[3]["reason"]
    assert len(list(tmp_path.glob("*.pt"))) == 3


def test_the_capture_limit_follows_the_disk_within_its_bounds():
    gb = 1 << 30
    assert checked.capture_limit(6 * gb) == checked.CAPTURE_LIMIT  # a nearly full disk: the old floor
    assert checked.capture_limit(60 * gb) == 20 * gb  # a third of what is free
    assert checked.capture_limit(1000 * gb) == checked.CAPTURE_CEILING


def test_configure_sets_the_limit_from_the_check_folders_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(checked, "SETUP", None)
    monkeypatch.setattr(checked.shutil, "disk_usage", lambda path: type("U", (), {"free": 90 << 30})())
    checked.configure(checked.CAPTURE, tmp_path)
    assert checked.SETUP.capture_limit == 30 << 30


def test_the_rows_summary_counts_each_reason_a_call_went_unchecked():
    from cutile_perf.child import checkrun

    limit = "this run's capture limit of 4 GB was reached ({} MB saved)"
    checks = ([{"status": "ok", "case": "a"}] +
              [{"status": "unchecked", "case": f"b{i}", "reason": "the timed call returns no tensor (a backward pass)"}
               for i in range(8)] +
              [{"status": "unchecked", "case": f"c{i}", "reason": limit.format(1024 * i)} for i in range(4)])
    text = checkrun.summary(checks)
    assert text.startswith("checked timed calls: 1 ok, 0 mismatch, 12 unchecked (")
    assert "8 the timed call returns no tensor (a backward pass), e.g. b0" in text
    assert "4 this run's capture limit of 4 GB was reached, e.g. c0" in text
