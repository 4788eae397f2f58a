"""A perf child saves at most ``checked.CAPTURE_LIMIT`` bytes of timed calls; past it each call is
unchecked with the reason (an unbounded capture filled a 64 GB disk during a TileGym baseline)."""
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
    monkeypatch.setattr(checked, "CAPTURE_LIMIT", 3 * 16 * 1024)  # input, result, sampled and after: 4 KB each
    timer = checked.wrap_timer(_timer, "events", "flushed", "test timer")
    checked.begin_test("tests/test_op.py::test_perf[1024]")
    for _ in range(5):
        assert timer(lambda: x * 2) == 1.0
    statuses = [line["status"] for line in lines]
    assert statuses[:3] == ["captured"] * 3 and statuses[3:] == ["unchecked"] * 2
    assert "capture limit" in lines[3]["reason"]
    assert len(list(tmp_path.glob("*.pt"))) == 3
