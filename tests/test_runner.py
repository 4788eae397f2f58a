"""runner: real child processes, process-group kill at the deadline, crash classification."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutile_perf.child import groups, runner


def _run(tmp_path: Path, code: str, timeout_s: float = 20.0) -> runner.RunResult:
    return runner.run([sys.executable, "-c", code], cwd=tmp_path, timeout_s=timeout_s,
                      output_path=tmp_path / "out.log")


def test_output_goes_to_the_file_even_when_large(tmp_path):
    """Regression: an unread pipe blocks a child that writes more than the pipe buffer."""
    result = _run(tmp_path, "print('x' * 1_000_000); print('end')")
    assert result.ok and result.returncode == 0
    assert result.tail(10).strip().endswith("end")
    assert runner.classify(result) is None


def test_deadline_kills_the_whole_process_group(tmp_path):
    """A grandchild that outlives its parent must not keep running after the timeout."""
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    result = _run(tmp_path, code, timeout_s=1.5)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < 15
    assert runner.classify(result) == "timeout"
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("grandchild survived the deadline")
    assert "killed after" in result.tail()


@pytest.mark.parametrize(
    ("output", "code", "expected"),
    [
        ("E   cuda.tile._exception.TileSyntaxError: break is not supported", 1, "compile"),
        ("E   SyntaxError: invalid syntax", 2, "compile"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", 1, "fault"),
        ("E   AssertionError: Tensor-likes are not close!", 1, "wrong-result"),
        ("no tests ran", 5, "no-tests"),
        ("something else went wrong", 1, "error"),
        ("", 0, None),
    ],
)
def test_classify_from_output_and_exit_code(tmp_path, output, code, expected):
    script = f"import sys; print({output!r}); sys.exit({code})"
    assert runner.classify(_run(tmp_path, script)) == expected


def test_killed_by_a_signal_is_a_fault(tmp_path):
    result = _run(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert result.returncode is not None and result.returncode < 0
    assert runner.classify(result) == "fault"


def test_missing_interpreter_is_reported_not_raised(tmp_path):
    result = runner.run(["/nonexistent/python"], cwd=tmp_path, timeout_s=5, output_path=tmp_path / "o.log")
    assert result.returncode == 127 and "cannot start" in result.tail()


def test_ending_a_group_returns_only_once_no_member_runs(tmp_path):
    """SIGKILL is delivered, not instant: under load a grandchild was seen alive right after the
    group was ended (the evals' time-limit test, about one run in three under -n 3)."""
    pidfile = tmp_path / "bg.pid"
    proc = subprocess.Popen(["bash", "-c", f"sleep 30 & echo $! > {pidfile}; sleep 30"], start_new_session=True)
    for _ in range(500):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        time.sleep(0.01)
    assert groups.live_members(proc.pid) >= 2  # the shell (or the sleep it exec'd) and the background sleep
    assert groups.end_group(proc.pid, leader=proc, grace_s=0.2, settle_s=2.0)
    assert groups.live_members(proc.pid) == 0
    assert proc.returncode is not None  # the leader was reaped
    done = subprocess.Popen(["true"], start_new_session=True)
    done.wait()
    assert not groups.end_group(done.pid)  # a group already gone is no error


def test_a_child_killed_at_its_deadline_gets_sigterm_first_and_a_grace_to_exit(tmp_path):
    """The deadline ends the group gracefully: a child that cleans up on SIGTERM gets to."""
    code = ("import signal, sys, time\n"
            "def bye(*_):\n    print('cleaned up', flush=True); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    result = _run(tmp_path, code, timeout_s=2.0)
    assert result.timed_out and "cleaned up" in result.tail()


def test_no_module_but_child_groups_signals_a_process_group():
    """One place ends process groups (issue 40): every other module goes through ``groups.end_group``."""
    package = Path(runner.__file__).resolve().parents[1]
    callers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if "killpg" in p.read_text(encoding="utf-8"))
    assert callers == ["child/groups.py"], callers
