"""The evals' only door to git: the ``git`` command with an environment cleaned of ``GIT_DIR`` and friends
(an exported ``GIT_DIR`` would point every call at some other repository)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


class GitError(RuntimeError):
    """A git command failed."""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}


def git_bytes(repo: Path, *args: str) -> bytes:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, env=_env())
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.decode(errors='replace').strip()[:300]}")
    return proc.stdout


def git(repo: Path, *args: str) -> str:
    return git_bytes(repo, *args).decode("utf-8", "replace")


def git_ok(repo: Path, *args: str) -> bool:
    """Whether the command exits 0 (for questions git answers with its exit code)."""
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, env=_env()).returncode == 0
