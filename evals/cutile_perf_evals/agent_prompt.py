"""The whole prompt for an agent launched by other means: environment, installed skills, task.

A CLI agent such as Claude Code finds ``.claude/skills/*/SKILL.md`` itself and lists each skill by
name and description; a general coding agent (a helper of another agent, an API loop) does not. For
those, ``agent-prompt.txt`` carries what the CLI would have shown: where to work, how to reach the
GPU (``gpu-run`` when the agent has none), and, with the skill, the same one-line listing. The task
text itself is ``prompt.txt``, unchanged, so both kinds of agent get the same task.
"""
from __future__ import annotations

from pathlib import Path

from cutile_perf.skill.assets import split_frontmatter

GPU_NOTE = (
    "- This machine has NO GPU. The user's GPU machine is reached only through the command "
    "`gpu-run '<shell command>'`. It queues the command, runs it with bash in a copy of this repository on the "
    "GPU machine (same path, same files, same git state, uncommitted changes included) and, when it ends, copies "
    "the repository (files and .git) back here and prints the command's output. The same commands are on PATH "
    "there (`python`, `pytest`, and anything in the repository); the repository's `src/` is on PYTHONPATH there, "
    "as a development install would be, and the GPU libraries are found through PYTHONPATH too, so extend it, "
    "never replace it. Jobs wait in a queue shared with other users, "
    "so one call can take several minutes: prefer few calls that each do a lot. Your jobs together may use at "
    "most {seconds:g} seconds of GPU time (gpu-run prints what is left); a job is killed at its timeout "
    "(`gpu-run --timeout SECONDS '...'`, default 300, never more than what is left).")


def skill_description(skill_md: Path) -> str:
    """The ``description`` of a SKILL.md's YAML front matter."""
    meta, _body = split_frontmatter(Path(skill_md).read_text(encoding="utf-8"))
    return " ".join(str(meta["description"]).split())


def agent_prompt(task_prompt: str, *, repo: Path, trial_dir: Path, path_dirs: list[Path], skill_md: Path | None,
                 gpu_seconds: float | None, note: str = "") -> str:
    lines = ["You are a coding agent. A user has given you the task quoted at the end. Work on it on your own "
             "until it is done; nobody will answer questions.", "", "Your environment:",
             f"- The user's repository is {repo} (a git repository). Work only inside {trial_dir}: run every "
             "command from the repository, and do not read, list or search anything elsewhere on this machine "
             "(other folders hold other people's work). You may use the search tools for public documentation.",
             f"- Start every bash command with `export PATH={':'.join(str(d) for d in path_dirs)}:/usr/bin:/bin "
             f"&& cd {repo} && ` (shell state does not carry over between commands)."]
    if gpu_seconds is not None:
        lines.append(GPU_NOTE.format(seconds=gpu_seconds))
    lines += [line for line in note.strip().splitlines() if line.strip()]
    if skill_md is not None:
        lines += ["", "Skills installed in this repository (a skill is a folder with a SKILL.md; read a skill's "
                      "SKILL.md when its description fits your task, and follow it):",
                  f"- cutile-perf: {skill_description(skill_md)} ({skill_md})"]
    lines += ["", "When you are done, reply with (1) your summary for the user and (2) the list of every command "
                  "you ran that used the GPU, in order, one per line.", "", "The user's task:", "",
              task_prompt.strip()]
    return "\n".join(lines) + "\n"
