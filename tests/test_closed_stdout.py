"""A reader that stops early (`cutile-perf status | head -1`) ends the command quietly (issue 43).

Before: `print` in cli.py raised BrokenPipeError, a traceback and exit 1, which the docs reserve for
"a check said no"; Python's flush at exit then printed a second "Exception ignored" line.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _run_with_reader_gone(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run cutile-perf with stdout a pipe whose reader closed before anything was written."""
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    proc = subprocess.Popen([sys.executable, "-m", "cutile_perf", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves at once, as `head -1` does after its line
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    return proc.wait(timeout=120), stderr


@pytest.mark.parametrize("args", [["example", "show", "softmax"], ["example", "list", "--json"]])
def test_a_closed_stdout_ends_quietly_with_the_commands_exit_code(args, tmp_path):
    code, stderr = _run_with_reader_gone(args, tmp_path)
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr
    assert code == 0


def test_an_error_still_exits_with_its_code_when_stdout_is_closed(tmp_path):
    # The JSON form of an error goes to stdout: the reader's absence does not change the exit code.
    code, stderr = _run_with_reader_gone(["example", "show", "no_such_op", "--json"], tmp_path)
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
    assert code == 2
