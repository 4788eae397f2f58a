"""Build a task's repository in a fresh directory: copy its source, apply its start state, commit.

Sources (``setup.source``):

* ``bundled``: ``examples/kernels`` without ``optimizations/`` (the prepared steps are the answers),
  then each ``setup.start`` file copied over its kernel file (a task may start from a prepared step);
* ``fixture``: a file or directory of ``evals/fixtures/`` (``setup.path``);
* ``tilegym``: ``src/``, ``tests/`` and the top-level setup files of an NVIDIA TileGym checkout
  (``--tilegym``), then ``setup.degrade`` edits (each ``old`` text must occur exactly once, so a
  changed upstream file fails here instead of giving a silently different task);
* ``copy``: any file or directory (absolute, or relative to this checkout), ``.git`` and ``sandbox/`` left out;
* ``none``: an empty repository with a README (questions that need no code).

The result is a git repository on ``main`` with one commit, ``eval start``: its sha is the base
every grade compares with. ``setup.session`` then optionally leaves a cutile-perf session behind,
killed in the middle of a ``try`` (the recovery task).
"""
from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cutile_perf_evals import CHECKOUT, EVALS_DIR, shim, tasks, vcs

FIXTURES = EVALS_DIR / "fixtures"
SUITE = CHECKOUT / "examples" / "kernels"
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "sandbox", ".git")
SUITE_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "sandbox", ".git", "optimizations")
TILEGYM_TOP = ("pyproject.toml", "setup.py", "setup.cfg", "pytest.ini", "conftest.py", "README.md", "LICENSE")
# Never part of the task's code: the harness scratch and the installed skill copies.
LOCAL_EXCLUDES = ("sandbox/", ".claude/", ".agents/")
START_MESSAGE = "eval start"


class BuildError(RuntimeError):
    """The task repository cannot be built (missing source, a degrade edit that does not apply)."""


@dataclass(frozen=True)
class Built:
    repo: Path
    base: str  # sha of the "eval start" commit


# The branch the repository is built on (the live-run note tells agents their work there is graded).
START_BRANCH = "main"

def git(repo: Path, *args: str) -> str:
    try:
        return vcs.git(repo, *args)
    except vcs.GitError as exc:
        raise BuildError(str(exc)) from None


def resolve_source(spec: str, tilegym: Path | None) -> Path:
    """A file named by a task: ``tilegym:<rel>``, ``fixture:<rel>``, an absolute path, or checkout-relative."""
    if spec.startswith("tilegym:"):
        if tilegym is None:
            raise BuildError(f"{spec} needs a TileGym checkout: pass --tilegym <path>")
        path = Path(tilegym) / spec[len("tilegym:"):]
    elif spec.startswith("fixture:"):
        path = FIXTURES / spec[len("fixture:"):]
    else:
        path = Path(spec) if Path(spec).is_absolute() else CHECKOUT / spec
    if not path.exists():
        raise BuildError(f"task file {spec} not found at {path}")
    return path


def _copy_contents(src: Path, dest: Path, ignore) -> None:
    if src.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / src.name)
        return
    shutil.copytree(src, dest, ignore=ignore, dirs_exist_ok=True)


def _docstring_lines(text: str) -> tuple[int, int] | None:
    """(first, last) 1-based lines of the module docstring, or None when there is none."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return None
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0].lineno, body[0].end_lineno
    return None


def swap_docstring(new_text: str, old_text: str) -> str:
    """``new_text`` with its module docstring replaced by the summary line of ``old_text``'s.

    A prepared step's docstring tells its story ("expected SLOWER on H200 ... revert"); a task that
    starts from that step must not hand the answer to the agent. Only the summary line of the
    kernel it replaces is kept: the rest of that docstring describes the replaced code.
    """
    new_span = _docstring_lines(new_text)
    if new_span is None:
        return new_text
    summary = (ast.get_docstring(ast.parse(old_text)) or "").strip().splitlines()[:1] if _docstring_lines(old_text) else []
    lines = new_text.splitlines(keepends=True)
    head = [f'"""{summary[0]}"""\n'] if summary else []
    return "".join(lines[: new_span[0] - 1] + head + lines[new_span[1]:])


def apply_degrade(text: str, edits: list[dict], where: str) -> str:
    """Apply ``[{"old", "new"}]`` text edits; each ``old`` must occur exactly once."""
    for number, edit in enumerate(edits, start=1):
        count = text.count(edit["old"])
        if count != 1:
            raise BuildError(f"{where}: degrade edit {number} matches {count} times, expected once: {edit['old'][:60]!r}")
        text = text.replace(edit["old"], edit["new"])
    return text


def _populate(task: dict, repo: Path, tilegym: Path | None) -> None:
    setup = task.get("setup") or {}
    kind = tasks.source(task)
    if kind == "bundled":
        _copy_contents(SUITE, repo, SUITE_SKIP)
    elif kind == "fixture":
        _copy_contents(resolve_source("fixture:" + setup["path"], None), repo, SKIP)
    elif kind == "copy":
        _copy_contents(resolve_source(setup["path"], None), repo, SKIP)
    elif kind == "tilegym":
        if tilegym is None or not (Path(tilegym) / "src").is_dir():
            raise BuildError(f"task {task['id']} needs a TileGym checkout: pass --tilegym <path with src/ and tests/>")
        for sub in ("src", "tests"):
            shutil.copytree(Path(tilegym) / sub, repo / sub, ignore=SKIP, dirs_exist_ok=True)
        for name in TILEGYM_TOP:
            if (Path(tilegym) / name).is_file():
                shutil.copy2(Path(tilegym) / name, repo / name)
    elif kind == "none":
        repo.mkdir(parents=True, exist_ok=True)
        (repo / "README.md").write_text("Workspace for the question asked.\n", encoding="utf-8")
    else:
        raise BuildError(f"task {task['id']}: unknown setup.source {kind!r}; known: {', '.join(tasks.SOURCES)}")
    for rel, spec in (setup.get("start") or {}).items():
        target = repo / rel
        if not target.parent.is_dir():
            raise BuildError(f"task {task['id']}: start file target {rel} has no directory in the repo")
        text = resolve_source(spec, tilegym).read_text(encoding="utf-8")
        if target.is_file():
            text = swap_docstring(text, target.read_text(encoding="utf-8"))
        target.write_text(text, encoding="utf-8")
    for rel, edits in (setup.get("degrade") or {}).items():
        path = repo / rel
        if not path.is_file():
            raise BuildError(f"task {task['id']}: degrade target {rel} not in the repo")
        path.write_text(apply_degrade(path.read_text(encoding="utf-8"), edits, rel), encoding="utf-8")


def init_git(repo: Path) -> str:
    git(repo, "init", "-q", "-b", START_BRANCH)
    for key, value in (("user.email", "eval@cutile-perf.invalid"), ("user.name", "cutile-perf eval"),
                       ("commit.gpgsign", "false")):
        git(repo, "config", key, value)
    exclude = repo / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with exclude.open("a", encoding="utf-8") as f:
        f.write("".join(p + "\n" for p in LOCAL_EXCLUDES))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", START_MESSAGE)
    return git(repo, "rev-parse", "HEAD").strip()


def build(task: dict, dest: Path, *, tilegym: Path | None = None) -> Built:
    """Build the task's repository at ``dest`` (must not exist); returns it with its base commit."""
    dest = Path(dest)
    if dest.exists():
        raise BuildError(f"{dest} already exists; the task repository is always built fresh")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _populate(task, dest, tilegym)
    base = init_git(dest)
    session = (task.get("setup") or {}).get("session")
    if session:
        leave_killed_session(dest, session, tilegym)
    return Built(dest, base)


def reference_files(task: dict, tilegym: Path | None = None) -> dict[str, bytes]:
    """``{fenced path: bytes}`` of the task's known faster version (empty when none is known)."""
    return {rel: resolve_source(spec, tilegym).read_bytes() for rel, spec in tasks.reference(task).items()}


# --- a session killed mid-iteration ----------------------------------------------------------------


def _cli(repo: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(shim.cli_argv(*args, "--repo", str(repo)), cwd=repo, env=shim.cli_env(),
                          capture_output=True, text=True, timeout=timeout)
    return proc


def _disable_gpu_gate(repo: Path) -> None:
    path = repo / "sandbox" / "session.yaml"
    path.write_text(path.read_text(encoding="utf-8").replace("require_gpu: true", "require_gpu: false"),
                    encoding="utf-8")


def leave_killed_session(repo: Path, spec: dict, tilegym: Path | None) -> None:
    """``init``, ``baseline``, then a ``try`` killed (SIGKILL to its process group) once its
    ``kill_at`` stage has started: the state a crashed machine or a killed terminal leaves.

    ``require_gpu: false`` is only for the simulated repository of the CPU tests.
    """
    steps = [("init", "--kernel", spec["kernel"], "--timeout", str(spec.get("timeout_s", 600)))]
    proc = _cli(repo, *steps[0])
    if proc.returncode != 0:
        raise BuildError(f"session setup: init failed: {(proc.stdout + proc.stderr).strip()[-400:]}")
    if spec.get("require_gpu") is False:
        _disable_gpu_gate(repo)
    proc = _cli(repo, "baseline", "--repeats", str(spec.get("repeats", 2)))
    if proc.returncode != 0:
        raise BuildError(f"session setup: baseline failed: {(proc.stdout + proc.stderr).strip()[-400:]}")
    for rel, source in (spec.get("edit") or {}).items():
        shutil.copyfile(resolve_source(source, tilegym), repo / rel)
    marker = repo / "sandbox" / "runs" / f"1-{spec.get('kill_at', 'correctness')}.log"
    child = subprocess.Popen(shim.cli_argv("try", spec.get("try", "candidate"), "--repo", str(repo)), cwd=repo,
                             env=shim.cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.monotonic() + float(spec.get("wait_s", 300))
    try:
        while not marker.exists():
            if child.poll() is not None:
                raise BuildError(f"session setup: try ended (exit {child.returncode}) before {marker.name} started")
            if time.monotonic() > deadline:
                raise BuildError(f"session setup: {marker.name} did not start within {spec.get('wait_s', 300)} s")
            time.sleep(0.05)
        time.sleep(float(spec.get("kill_delay_s", 0.5)))
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
