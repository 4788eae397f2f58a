"""The ``cutile-perf`` the agent calls: this checkout's CLI behind a wrapper that logs every call.

The harness does not log refusals (exit 3 leaves no row in ``experiments.jsonl``), and the log
it does write lives inside the repository where the agent can edit it. So the runner puts this
wrapper first on the agent's PATH: each call appends ``{"argv", "cwd", "exit", "stderr_tail",
"start", "seconds"}`` to a file outside the repository, whose path is baked into the wrapper.
stderr is passed through line by line (progress stays visible) and its tail is kept.

An agent that calls ``python -m cutile_perf`` directly bypasses the wrapper; what it did is then
seen only through git and the harness log, which the grader checks against each other anyway.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

from cutile_perf_evals import CHECKOUT

WRAPPER = '''\
#!{python}
# Written by cutile-perf's eval runner: logs each call to {log!r}, then runs this checkout's CLI.
import json, os, subprocess, sys, time

LOG = {log!r}
env = dict(os.environ)
env["PYTHONPATH"] = os.pathsep.join(p for p in ({scripts!r}, env.get("PYTHONPATH", "")) if p)
if {withhold!r}:  # the op under evaluation: its prepared steps are its answers
    env["CUTILE_PERF_WITHHOLD_EXAMPLES"] = {withhold!r}
start = time.time()
tail = []
proc = subprocess.Popen([sys.executable, "-m", "cutile_perf", *sys.argv[1:]], env=env, stderr=subprocess.PIPE)
for line in proc.stderr:
    sys.stderr.buffer.write(line)
    sys.stderr.flush()
    tail = (tail + [line.decode("utf-8", "replace")])[-20:]
code = proc.wait()
row = {{"argv": sys.argv[1:], "cwd": os.getcwd(), "exit": code, "stderr_tail": "".join(tail)[-1500:],
        "start": start, "seconds": round(time.time() - start, 3)}}
try:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\\n")
except OSError as exc:  # the command ran: its exit code stands, the missing row is said aloud
    sys.stderr.write(f"cutile-perf (eval wrapper): could not log this call to {{LOG}}: {{exc}}\\n")
sys.exit(code)
'''


def scripts_dir() -> Path:
    return CHECKOUT / "scripts"


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for running this checkout's ``cutile_perf`` in a child process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(scripts_dir()), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "cutile_perf", *args]


def write_wrapper(bin_dir: Path, log_path: Path, withhold: tuple[str, ...] = ()) -> Path:
    """Write ``bin_dir/cutile-perf`` (executable) logging to ``log_path``; returns its path.

    ``withhold``: bundled ops whose prepared steps the CLI will not show through this wrapper (an
    agent that runs ``python -m cutile_perf`` itself gets round it, and its commits still show
    the copy in the grade's ``shipped_step``).
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "cutile-perf"
    path.write_text(WRAPPER.format(python=sys.executable, log=str(log_path), scripts=str(scripts_dir()),
                                   withhold=",".join(withhold)), encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def read_calls(log_path: Path) -> list[dict]:
    """The logged calls; a missing file means none, a cut last line is skipped."""
    if not Path(log_path).is_file():
        return []
    calls = []
    for line in Path(log_path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("argv"), list):
            calls.append(row)
    return calls


def subcommand(call: dict) -> str | None:
    """The subcommand of a logged call (global options such as ``--repo X`` skipped)."""
    argv = call.get("argv") or []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--repo",):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return arg
    return None
