"""Checked timed backward passes (issue 39 item 1: "and gradients where the test times the backward").

A TileGym-shaped perf test in miniature, on the CPU: the forward is timed, then
``lambda: out.backward(dy, retain_graph=True)``. The candidate's process captures; a second
configuration replays on the base op, as the reference child does (``child/checked.py``). Without
``checked_backward`` the backward call was unchecked ("returns no tensor"), so a backward that does
no work once timed was kept.
"""
from __future__ import annotations

import json
import shutil

import pytest

from cutile_perf.child import checked, checked_backward, tensor_summary

torch = pytest.importorskip("torch", reason="checked timed calls capture torch tensors")

NODE = "tests/ops/test_square.py::test_perf[64]"


def square_op(cheat_after: int | None = None):
    """x * x with its own backward; ``cheat_after``: the backward stops working after that many calls."""
    calls = {"n": 0}

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            calls["n"] += 1
            if cheat_after is not None and calls["n"] > cheat_after:
                return torch.zeros_like(x)  # no work once it has seen a few calls: the timed ones
            return 2 * x * grad

    return Square.apply


def _timer(fn, repeats=5):
    for _ in range(repeats):
        fn()
    return 1.0


def perf_test(op, seed: int) -> None:
    """What TileGym's ``benchmark`` does: time the forward, then the backward of one output."""
    timer = checked.wrap_timer(_timer, checked.fixed("events", "flushed"), "benchmark_fn")
    checked.begin_test(NODE)
    x = torch.randn(64, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    forward = lambda: op(x)  # noqa: E731
    timer(forward)
    out = forward()
    dy = torch.ones_like(out)
    timer(lambda: out.backward(dy, retain_graph=True))


def capture_then_replay(tmp_path, monkeypatch, candidate, base, base_seed=2) -> tuple[list[dict], list[dict]]:
    captured, checks = [], []
    monkeypatch.setattr(checked, "SETUP", None)
    checked.configure(checked.CAPTURE, tmp_path / "capture", captured.append)
    perf_test(candidate, seed=1)
    replay = tmp_path / "replay"
    replay.mkdir()
    wanted = [line for line in captured if line["status"] == "captured"]
    for line in wanted:
        shutil.copyfile(tmp_path / "capture" / line["file"], replay / line["file"])
    (replay / "index.json").write_text(json.dumps(wanted))
    checked.configure(checked.REPLAY, replay, checks.append)
    with pytest.raises(pytest.skip.Exception):  # the reference child skips after the last checked call
        perf_test(base, seed=base_seed)  # the base test draws other inputs: the captured ones are copied in
    return captured, [c for c in checks if "nodeid" in c]


def test_an_honest_backward_is_checked_by_its_gradients(tmp_path, monkeypatch):
    captured, checks = capture_then_replay(tmp_path, monkeypatch, square_op(), square_op())
    assert [line["status"] for line in captured] == ["captured", "captured"]
    assert captured[1]["backward"] and captured[1]["forward_ordinal"] == 1
    assert [c["status"] for c in checks] == ["ok", "ok"]
    assert "backward" in checks[1]["reason"]


def test_a_backward_that_does_less_work_once_timed_is_a_mismatch(tmp_path, monkeypatch):
    _captured, checks = capture_then_replay(tmp_path, monkeypatch, square_op(cheat_after=3), square_op())
    assert checks[0]["status"] == "ok"  # its forward is honest
    assert checks[1]["status"] == "mismatch" and "after the timer" in checks[1]["reason"]


@pytest.mark.parametrize("cheat_after, status", [(None, "ok"), (3, "mismatch")])
def test_gradients_too_large_to_save_whole_are_checked_by_their_summary(tmp_path, monkeypatch, cheat_after, status):
    """Past ``INLINE_BYTES`` the leaves are fingerprinted and the gradients summarized (dicts): on the
    H200 every TileGym silu_and_mul backward call ended "capture failed: 'dict' object has no attribute
    'numel'" (session 36) because the capture's size was counted as if each were a tensor."""
    monkeypatch.setattr(tensor_summary, "INLINE_BYTES", 64)  # the 64 float32 of perf_test: 256 bytes
    # a fingerprinted input is not copied in: the seeded base test builds the same one, as TileGym's do
    captured, checks = capture_then_replay(tmp_path, monkeypatch, square_op(cheat_after), square_op(), base_seed=1)
    assert [line["status"] for line in captured] == ["captured", "captured"], captured
    assert captured[1]["bytes"] == 3 * 64 * 4  # x, dy and x.grad, moved by the backward (the floor's bytes)
    assert [c["status"] for c in checks] == ["ok", status], checks


def test_the_leaves_gradients_are_put_back_after_the_capture(tmp_path, monkeypatch):
    monkeypatch.setattr(checked, "SETUP", None)
    checked.configure(checked.CAPTURE, tmp_path, [].append)
    timer = checked.wrap_timer(_timer, checked.fixed("events", "flushed"), "benchmark_fn")
    checked.begin_test(NODE)
    x = torch.ones(8, requires_grad=True)
    op = square_op()
    timer(lambda: op(x))
    out = op(x)
    timer(lambda: out.backward(torch.ones(8), retain_graph=True))
    assert torch.equal(x.grad, torch.full((8,), 10.0))  # five timed calls of 2 * x, as without the check


def test_a_backward_with_no_forward_seen_is_unchecked_with_the_reason(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(checked, "SETUP", None)
    checked.configure(checked.CAPTURE, tmp_path, lines.append)
    timer = checked.wrap_timer(_timer, checked.fixed("events", "flushed"), "benchmark_fn")
    checked.begin_test(NODE)
    x = torch.ones(8, requires_grad=True)
    out = square_op()(x)  # built outside any timer
    timer(lambda: out.backward(torch.ones(8), retain_graph=True))
    assert lines[0]["status"] == "unchecked" and "forward call this check did not see" in lines[0]["reason"]


def test_set_at_rebinds_closure_cells_and_dict_items_only():
    held = {"first_output": 1}
    value = 2

    def reads_dict():
        return held

    def reads_cell():
        return value

    assert checked_backward._set_at(reads_dict, "fn.cell[0]['first_output']", 3) and held["first_output"] == 3
    assert checked_backward._set_at(reads_cell, "fn.cell[0]", 4) and reads_cell() == 4
    assert not checked_backward._set_at(lambda t=(1,): t, "fn.defaults[0][0]", 5)
