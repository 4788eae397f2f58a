"""The only owner of pytest child processes.

Each child runs in its own process group with its output sent to a file (an unread pipe fills up
and blocks the child forever), and the whole group is killed at the deadline: a hung kernel
launch, a tileiras compile that never ends or a test that forks workers all stop together.
``classify`` turns what happened into one crash class.
"""
from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.child import box as boxmod
from cutile_perf.child import groups
from cutile_perf.child import warmstart
from cutile_perf.child.box import Box
from cutile_perf.judge.crash import CrashClass
from cutile_perf.store import safe_read

# pytest exit codes (pytest.ExitCode), named here to keep the import of pytest out of the harness.
PYTEST_OK = 0
PYTEST_NO_TESTS = 5


_TERM_GRACE_S = 3.0  # how long a child killed at its deadline may take to exit on its own
_SETTLE_S = 2.0  # how long after SIGKILL we wait for its group's members to be gone
_TAIL_CHARS = 4000
# What the classifier reads of a child's output: its last 64,000 characters, and pytest's failure
# lines (short test summary, ``E`` lines of the tracebacks) searched from the end through at most
# _SCAN_BYTES, in 1 MB chunks: a child that prints 300 MB before or after them costs no memory.
_CLASSIFY_CHARS = 64_000
_SCAN_BYTES = 1 << 30
_FAILURE_LINE = re.compile(rb"\n(?:(?:FAILED|ERROR) \S|E {2,}\S)[^\n]{0,2000}")
_FAILURE_LINES = 50

# Checked in this order: a compile error often surfaces as a failed assertion later in the output.
_SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("compile", re.compile(
        r"TileError|TileCompilerError|TileSyntaxError|TypeCheckingError|UnsupportedSyntaxError|"
        r"UnsupportedFeatureError|UnsupportedCallError|StaticAssertionError|StaticEvalError|"
        r"CompilerExecutionError|CompilerTimeoutError|InternalCompilerError|tileiras.*(error|failed)|"
        r"\bSyntaxError\b|\bIndentationError\b|ImportError while importing|ModuleNotFoundError")),
    ("fault", re.compile(
        r"CUDA error|CUDA_ERROR_\w+|cudaError\w*|illegal memory access|misaligned address|"
        r"unspecified launch failure|device-side assert|Segmentation fault|core dumped|Fatal Python error|"
        r"\bSIGSEGV\b|\bSIGABRT\b|\bSIGBUS\b", re.IGNORECASE)),
    ("wrong-result", re.compile(
        r"AssertionError|Mismatched elements|are not close|not close|Not equal to tolerance|assert_close|"
        r"allclose")),
)


@dataclass(frozen=True)
class RunResult:
    """One pytest child: how it ended, how long it took and where its output is."""

    argv: tuple[str, ...]
    returncode: int | None  # None when it was killed at the deadline
    timed_out: bool
    duration_s: float
    output_path: Path

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == PYTEST_OK

    def tail(self, chars: int = _TAIL_CHARS) -> str:
        """The end of the output, read from the end (a child that printed 300 MB costs its tail)."""
        return safe_read.tail_text(self.output_path, chars)

    def failure_lines(self) -> list[str]:
        """pytest's lines that say why tests failed (``FAILED ... - AssertionError: ...``, ``E   ...``),
        found from the end of the output however much the child printed after them (within
        ``_SCAN_BYTES``)."""
        return safe_read.matching_lines(self.output_path, _FAILURE_LINE, _SCAN_BYTES, _FAILURE_LINES)


class Gate:
    """A pipe a perf child waits on before its first test (``CUTILE_PERF_GATE_FD``, read by
    ``pytest_plugin.Gate``): ``open()`` lets it run, ``close()`` (or the harness dying) cancels it.
    Either, once. The pool holds a timed run there until the spare child started beside it waits
    before any code of the repository (``child.pool``), so nothing works beside a timed test.

    The read end belongs to ``run``, which hands it to the child and closes it when the child has
    ended (never earlier: the number could be reused before the child has inherited it); a caller
    that never calls ``run`` closes it with ``unused()``."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()
        self.opened_at: float | None = None

    def open(self, handover: bytes = b"") -> bool:
        """Let the child go, handing it ``handover`` after the go byte (the node ids of a spare
        child started before its run's cases were known: ``child.warmstart``); False when it had
        already ended (nobody read the pipe any more)."""
        delivered = False
        if self._write_fd is not None:
            with contextlib.suppress(OSError):  # BrokenPipeError: the child has already ended
                # Blocks only while the pipe is full: the child reads to the end of file once let go.
                data = memoryview(b"1" + handover)
                while data:
                    data = data[os.write(self._write_fd, data):]
                delivered = True
            self.opened_at = time.monotonic()
        self.close()
        return delivered

    def close(self) -> None:
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None

    def unused(self) -> None:
        os.close(self.read_fd)


class StartGate:
    """What holds a spare child (``child.warmstart``) before any code of the repository runs in it:
    ``wait_ready`` returns once it has made its early imports and waits, ``open()`` lets it go on,
    ``close()`` (or the harness dying) cancels it.

    ``run`` hands the child the gate's read end and the ready pipe's write end (it writes one byte
    there once it waits) and closes both when the child has ended; the caller closes the ready
    pipe's read end with ``done()``."""

    def __init__(self) -> None:
        self.gate = Gate()
        self._ready_read, self.ready_write = os.pipe()
        self.handed = False  # ``run`` took the child's ends (and closes them)
        self._on_open: list[Callable[[], None]] = []

    @property
    def opened_at(self) -> float | None:
        return self.gate.opened_at

    def on_open(self, step: Callable[[], None]) -> None:
        """Run ``step`` in ``open()``, just before the child is let go: what must see the checkout
        as the child will find it (another child may use the checkout until then)."""
        self._on_open.append(step)

    def open(self, handover: bytes = b"") -> bool:
        steps, self._on_open = self._on_open, []
        for step in steps:
            step()
        return self.gate.open(handover)

    def close(self) -> None:
        self.gate.close()

    def wait_ready(self, timeout_s: float, ended: Callable[[], bool]) -> bool:
        """True once the child waits at the gate, or has ended (either way nothing of it runs
        beside the caller's next step); False when neither happened within ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while True:
            readable, _, _ = select.select([self._ready_read], [], [], 0.2)
            if readable or ended():
                return True
            if time.monotonic() >= end:
                return False

    def unused(self) -> None:
        """For a caller that never called ``run``: close the child's ends too."""
        self.gate.unused()
        os.close(self.ready_write)

    def done(self) -> None:
        os.close(self._ready_read)


def run(argv: list[str], *, cwd: Path, timeout_s: float, output_path: Path,
        env_overrides: dict[str, str] | None = None, secret: bytes | None = None,
        on_start: Callable[[int], None] | None = None, gate: Gate | None = None,
        box: Box | None = None, start: StartGate | None = None) -> RunResult:
    """Run ``argv`` in ``cwd`` with its own process group; output goes to ``output_path``.

    ``secret`` reaches the child through a pipe whose descriptor is named by ``CUTILE_PERF_KEY_FD``
    (never through the environment). ``on_start(pgid)`` is called as soon as the child exists, so
    the caller can persist the group and a later ``resume`` can end it after a ``kill -9``.
    ``gate``: the child waits on it before its first test (the read end is the child's alone).
    ``start``: start it ahead of its turn (``child.warmstart``; ``argv`` must be a
    ``<python> -m pytest`` command): it imports what needs no repository, then waits on ``start``.
    ``box``: run it in that sandbox (``box.py``): its environment from the allow-list instead of a
    copy of ours, paths in it rewritten to the box's, the group led by ``unshare``.
    Never raises for a failing or hanging child; KeyboardInterrupt kills the group, then propagates.
    """
    output_path.parent.mkdir(parents=True, exist_ok=True)
    env = (knobs.child_env if box is None else knobs.allowed_child_env)(**(env_overrides or {}))
    # The record plugin must be importable in the child even when cutile-perf runs from a checkout;
    # after a caller's own PYTHONPATH (a pristine checkout's package roots must come first).
    env = with_package_on_path(env, last="PYTHONPATH" in (env_overrides or {}))
    pass_fds: tuple[int, ...] = ()
    if secret is not None:
        read_fd, write_fd = os.pipe()
        os.write(write_fd, secret)
        os.close(write_fd)
        pass_fds = (read_fd,)
        env["CUTILE_PERF_KEY_FD"] = str(read_fd)
    if gate is not None:
        pass_fds = (*pass_fds, gate.read_fd)
        env["CUTILE_PERF_GATE_FD"] = str(gate.read_fd)
    command = argv
    if start is not None:
        command = warmstart.warm_argv(argv)
        if command is None:
            raise ValueError(f"only a '<python> -m pytest' command can start ahead of its turn, not {argv[:3]}")
        # No folder of the checkout on its path until it is let go (the box rewrites both values).
        env["PYTHONPATH"], env["CUTILE_PERF_LATE_PYTHONPATH"] = warmstart.split_pythonpath(env.get("PYTHONPATH", ""),
                                                                                           cwd)
        pass_fds = (*pass_fds, start.ready_write, start.gate.read_fd)
        env["CUTILE_PERF_READY_FD"], env["CUTILE_PERF_START_FD"] = str(start.ready_write), str(start.gate.read_fd)
        # It starts in "/" and moves to the checkout when let go: an empty or relative entry of
        # LD_LIBRARY_PATH or PATH then finds nothing of the checkout while it waits.
        env["CUTILE_PERF_LATE_CWD"] = str(cwd)
        start.handed = True
    start_dir = "/" if start is not None else cwd
    if box is not None:
        env = box.env(env)
        command = box.wrap(command, start_dir)
    began = time.monotonic()
    try:
        with output_path.open("wb") as out:
            out.write(("$ " + " ".join(argv) + (" (in the sandbox)" if box else "")
                       + (" (started ahead of its turn)" if start else "")
                       + "\n").encode())
            out.flush()
            try:
                proc = subprocess.Popen(command, cwd=start_dir, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, start_new_session=True, pass_fds=pass_fds)
            except OSError as exc:  # the interpreter or command does not exist
                out.write(f"cannot start: {exc}\n".encode())
                return RunResult(tuple(argv), 127, False, time.monotonic() - began, output_path)
            result = _wait(proc, argv, timeout_s, output_path, began, on_start)
            if box is not None:
                result = replace(result, returncode=boxmod.returncode(result.returncode))
            return result
    finally:
        for fd in pass_fds:
            os.close(fd)


def _wait(proc: subprocess.Popen, argv: list[str], timeout_s: float, output_path: Path, start: float,
          on_start: Callable[[int], None] | None) -> RunResult:
    try:
        if on_start is not None:
            on_start(proc.pid)  # the pid is the group id: start_new_session=True
        timed_out = False
        proc.wait(timeout=max(timeout_s, 0.001))
    except subprocess.TimeoutExpired:
        timed_out = True
        groups.end_group(proc.pid, leader=proc, grace_s=_TERM_GRACE_S, settle_s=_SETTLE_S)
    except BaseException:
        groups.end_group(proc.pid, leader=proc, grace_s=_TERM_GRACE_S, settle_s=_SETTLE_S)
        raise
    else:
        # A test that spawned a daemon must not keep running into the next iteration.
        groups.end_group(proc.pid)
    duration = time.monotonic() - start
    if timed_out:
        with output_path.open("ab") as out:
            out.write(f"\ncutile-perf: killed after {timeout_s:.0f} s (iteration time budget)\n".encode())
    return RunResult(tuple(argv), None if timed_out else proc.returncode, timed_out, duration, output_path)


def classify(result: RunResult, failures: Iterable[str] = ()) -> CrashClass | None:
    """The crash class of a finished child, or None when pytest passed.

    Read: the end of its output, pytest's failure lines found from the end (``failure_lines``), and
    ``failures``, the messages its run report gives for the tests that failed
    (``runreport.RunReport.failures``), which no amount of output can push away.
    ``no-record`` is decided by the caller, which knows whether records were expected.
    """
    if result.timed_out:
        return CrashClass.TIMEOUT
    if result.returncode == PYTEST_OK:
        return None
    if result.returncode == PYTEST_NO_TESTS:
        return CrashClass.NO_TESTS
    text = "\n".join([*failures, *result.failure_lines(), result.tail(_CLASSIFY_CHARS)])
    for name, pattern in _SIGNATURES:
        if pattern.search(text):
            return CrashClass(name)
    if result.returncode is not None and result.returncode < 0:  # killed by a signal: segfault, abort
        return CrashClass.FAULT
    return CrashClass.ERROR


def package_parent() -> Path:
    """The directory holding the ``cutile_perf`` package, for the child's PYTHONPATH."""
    return Path(__file__).resolve().parents[2]


def with_package_on_path(env: dict[str, str], *, last: bool = False) -> dict[str, str]:
    """A copy of ``env`` whose PYTHONPATH holds ``package_parent()`` (first, or ``last``), so a child
    process imports this ``cutile_perf`` even where it is not installed (a GPU box running the checkout)."""
    parts = [str(package_parent()), env.get("PYTHONPATH", "")]
    if last:
        parts.reverse()
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in parts if p)}
