"""Launch any CLI agent from a command template, in its own process group, under a time limit.

Placeholders of the ``--agent`` template (each value is shell-quoted when substituted):

| Placeholder | Value |
| --- | --- |
| ``{prompt_file}`` | path of the file holding the prompt |
| ``{prompt}`` | the prompt text itself |
| ``{repo}`` | the task repository (also the working directory) |
| ``{trial_dir}`` | the trial's artifact directory (outside the repository) |
| ``{time_limit}`` | the time limit in seconds |

The command runs through ``bash -c`` with the logging ``cutile-perf`` wrapper first on PATH;
stdout and stderr go to files (an unread pipe would block the agent). At the limit the whole
process group gets SIGTERM, then SIGKILL.
"""
from __future__ import annotations

import os
import shlex
import string
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cutile_perf.child import groups

PLACEHOLDERS = ("prompt_file", "prompt", "repo", "trial_dir", "time_limit")
TERM_GRACE_S = 5.0


class TemplateError(ValueError):
    """The agent command template names an unknown placeholder."""


@dataclass(frozen=True)
class AgentRun:
    command: str
    exit_code: int | None  # None when killed at the limit
    timed_out: bool
    wall_s: float
    stdout: str  # paths
    stderr: str


def render(template: str, values: dict[str, str]) -> str:
    """Fill the template; unknown placeholders are an error (a typo would run the wrong command)."""
    names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    unknown = names - set(PLACEHOLDERS)
    if unknown:
        raise TemplateError(f"unknown placeholder(s) {sorted(unknown)} in --agent; known: "
                            + ", ".join("{" + p + "}" for p in PLACEHOLDERS))
    return template.format(**{k: shlex.quote(str(v)) for k, v in values.items()})


def launch(template: str, *, repo: Path, prompt_file: Path, trial_dir: Path, time_limit_s: float,
           bin_dir: Path) -> AgentRun:
    prompt = Path(prompt_file).read_text(encoding="utf-8")
    command = render(template, {"prompt_file": prompt_file, "prompt": prompt, "repo": repo,
                                "trial_dir": trial_dir, "time_limit": int(time_limit_s)})
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    out, err = Path(trial_dir) / "agent.stdout", Path(trial_dir) / "agent.stderr"
    start = time.monotonic()
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(["bash", "-c", command], cwd=repo, env=env, stdout=fo, stderr=fe,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            groups.end_group(proc.pid, leader=proc, grace_s=TERM_GRACE_S, settle_s=2.0)
        except BaseException:
            groups.end_group(proc.pid, leader=proc, grace_s=TERM_GRACE_S, settle_s=2.0)
            raise
        else:  # anything the agent left running in the background stops with it
            groups.end_group(proc.pid)
    return AgentRun(command, None if timed_out else proc.returncode, timed_out, round(time.monotonic() - start, 2),
                    str(out), str(err))
