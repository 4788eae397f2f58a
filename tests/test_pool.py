"""The child pool (``child.pool``) with stand-in children: threads that speak the gates' pipes as a
pytest child does, so the pool's rules are checked in milliseconds. The real children are in
``test_prestart_perf.py``."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import pytest

from cutile_perf.child import pool as pool_mod
from cutile_perf.child.pool import Pool, Request


@dataclass
class Ran:
    """What a stand-in child returns: its request, whether it was a spare and what it was handed."""

    request: Request
    spare: bool
    handed: bytes
    duration_s: float = 0.0


def _read_all(fd: int) -> bytes:
    data = bytearray()
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return bytes(data)


class Children:
    """Stand-in children. A spare "imports" for ``park_s``, says it waits, and goes on when let go;
    every child notes in ``events`` when its first test starts. ``None`` from a gate: cancelled."""

    def __init__(self, park_s: float = 0.0):
        self.park_s = park_s
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def note(self, what: str, tag: str) -> None:
        with self.lock:
            self.events.append((what, tag))

    def launch(self, request: Request):
        def job(gate, start, on_start):
            on_start(os.getpid() + 10**6)  # a group id nobody has: ending it is a no-op
            handed = b""
            if start is not None:
                time.sleep(self.park_s)
                self.note("parked", request.tag)
                os.write(start.ready_write, b"1")
                os.close(start.ready_write)
                received = _read_all(start.gate.read_fd)
                if received[:1] != b"1":
                    self.note("cancelled", request.tag)
                    return None
                handed = received[1:]
                self.note("let go", request.tag)
            if gate is not None and _read_all(gate.read_fd)[:1] != b"1":
                self.note("cancelled", request.tag)
                return None
            self.note("first test", request.tag)
            return Ran(request, start is not None, handed)
        return job


def _pool(children: Children, may_park=lambda r: r.name == "perf", ready_s: float = 5.0) -> Pool:
    return Pool(children.launch, may_park, lambda: ready_s)


def test_a_run_expected_starts_as_a_spare_and_is_handed_its_cases_when_let_go():
    children = Children()
    pool = _pool(children)
    try:
        pool.expect([Request("perf", "1", "c")])
        correctness = pool.run(Request("correctness", "1", "c"))
        assert not correctness.spare
        cases = {"a": "t.py::test[a]"}
        perf = pool.run(Request("perf", "1", "c", cases))
        assert perf.spare and perf.handed == b'["t.py::test[a]"]'
    finally:
        pool.close()


def test_a_spare_for_another_run_is_ended_and_the_run_starts_fresh():
    children = Children()
    pool = _pool(children)
    try:
        pool.expect([Request("perf", "1", "c")])
        pool.run(Request("correctness", "1", "c"))
        other = pool.run(Request("perf", "1", "another-commit"))
        assert not other.spare
        assert ("cancelled", "1") in children.events
    finally:
        pool.close()


def test_a_timed_run_starts_its_first_test_only_once_every_spare_is_parked():
    """The rule that keeps a timed run alone: spares import beside its start-up, never beside its tests."""
    children = Children(park_s=0.3)
    pool = _pool(children)
    try:
        pool.expect([Request("perf", "r2", "c"), Request("perf", "r3", "c")])
        pool.run(Request("perf", "r1", "c"))
        first_test = children.events.index(("first test", "r1"))
        assert {("parked", "r2"), ("parked", "r3")} <= set(children.events[:first_test]), children.events
    finally:
        pool.close()


def test_a_spare_not_parked_in_time_is_ended_before_the_timed_run_and_its_run_starts_fresh(capsys):
    children = Children(park_s=1.0)
    pool = _pool(children, ready_s=0.0)
    try:
        pool.expect([Request("perf", "r2", "c")])
        pool.run(Request("perf", "r1", "c"))
        assert children.events.index(("cancelled", "r2")) < children.events.index(("first test", "r1"))
        assert not pool.run(Request("perf", "r2", "c")).spare
        assert "was not parked in time" in capsys.readouterr().err
    finally:
        pool.close()


def test_only_what_may_park_starts_as_a_spare_and_correctness_runs_never_do():
    children = Children()
    pool = _pool(children, may_park=lambda r: False)
    try:
        pool.expect([Request("perf", "1", "c")])
        pool.run(Request("correctness", "1", "c"))
        assert not pool.run(Request("perf", "1", "c")).spare
        assert not [e for e in children.events if e[0] == "parked"]
    finally:
        pool.close()


def test_at_most_spares_at_once_wait(monkeypatch):
    monkeypatch.setattr(pool_mod, "SPARES_AT_ONCE", 2)
    children = Children()
    pool = _pool(children)
    try:
        pool.expect([Request("perf", f"r{k}", "c") for k in range(2, 6)])
        pool.run(Request("perf", "r1", "c"))
        assert sorted(tag for what, tag in children.events if what == "parked") == ["r2", "r3"]
    finally:
        pool.close()


def test_closing_the_pool_cancels_every_spare():
    children = Children()
    pool = _pool(children)
    pool.expect([Request("perf", "r2", "c"), Request("perf", "r3", "c")])
    pool.run(Request("perf", "r1", "c"))
    pool.close()
    assert {("cancelled", "r2"), ("cancelled", "r3")} <= set(children.events)


def test_an_interrupt_while_a_run_waits_ends_it_and_propagates(monkeypatch):
    children = Children()
    pool = _pool(children)
    monkeypatch.setattr(Pool, "_settle", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.run(Request("perf", "r1", "c"))
        assert ("cancelled", "r1") in children.events
    finally:
        pool.close()
