"""What the red-team tests share: driving the CLI on the simulated repository, and the promise.

Used by ``test_redteam.py`` and the test files that mount attacks the same way (the box, the
fence, the timer identity, the loop windows...). The promise every attack is checked against:

    not kept, nothing lost  (``assert_not_kept_nothing_lost``): HEAD is still the last kept commit,
    exactly one new row that is not a keep, the attempted change saved in the patch the row names,
    the fenced files back at HEAD's content, and every file outside the fence byte-identical (work
    tree, ignored and excluded files, ``.git/info`` and ``.git/hooks`` included).

The fixtures ``_template``, ``repo`` and ``reap`` are imported by name into the test modules that
use them (``# noqa: F401``): ``_template`` is module-scoped, so each module baselines its own.
Not a test module: pytest collects only ``test_*.py``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures_repo import KERNEL_REL, allow_no_gpu, build_tilegym_like_repo, edit_session, git, interruptible

from cutile_perf.cli import main

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
FENCE = (KERNEL_REL,)
FAST = {"256x1024": 0.5, "4096x1024": 1.0}
SLOW = {"256x1024": 1.5, "4096x1024": 3.0}


# --- driving the CLI ------------------------------------------------------------------------------


def call(repo: Path, command: str, *args: str) -> tuple[int, dict, str]:
    """``cutile-perf <command> --repo <repo> --json <args>`` in this process: (exit code, last JSON line, stdout)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            code = main([command, "--repo", str(repo), "--json", *args])
        except SystemExit as exc:  # argparse: an unknown subcommand or option
            code = exc.code if isinstance(exc.code, int) else 2
    text = buf.getvalue()
    data = {}
    for line in reversed(text.strip().splitlines()):
        try:
            data = json.loads(line)
            break
        except ValueError:
            continue
    return code, data, text


def spawn(repo: Path, command: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The CLI as a real process (so it can be killed or kill itself), with our package first on the path."""
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
        p for p in (str(SCRIPTS), (env or {}).get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))) if p)}
    return subprocess.Popen([sys.executable, "-m", "cutile_perf", command, "--repo", str(repo), "--json", *args],
                            env=full_env, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def rows(repo: Path) -> list[dict]:
    path = repo / "sandbox/experiments.jsonl"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def append_to_kernel(repo: Path, code: str) -> None:
    """Append attack code to the kernel. ``__REPO__`` becomes the repository's absolute path: a
    hostile agent knows where the repository it edits lives, even when the tests run elsewhere."""
    with (repo / KERNEL_REL).open("a", encoding="utf-8") as fh:
        fh.write("\n" + code.strip("\n").replace("__REPO__", repr(str(repo))) + "\n")


# --- the promise ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Before:
    head: str
    rows: int
    files: dict[str, bytes | tuple[str, str]]  # every file outside the fence: bytes, or ("link", target)


def user_files(repo: Path) -> dict[str, bytes | tuple[str, str]]:
    """Every file the user owns outside the fence: the work tree (ignored and excluded files too),
    ``.git/info`` and ``.git/hooks``; not ``sandbox/`` (the harness's own) nor the rest of ``.git``."""
    out: dict[str, bytes | tuple[str, str]] = {}
    for top, dirs, files in os.walk(repo, followlinks=False):
        rel_top = Path(top).relative_to(repo).as_posix()
        if rel_top == ".":
            dirs[:] = [d for d in dirs if d != "sandbox"]
        elif rel_top == ".git":
            dirs[:] = [d for d in dirs if d in ("info", "hooks")]
            continue  # .git/HEAD, index, config... are git's, and move with every commit
        for name in [*files, *(d for d in dirs if (Path(top) / d).is_symlink())]:
            path = Path(top) / name
            rel = path.relative_to(repo).as_posix()
            if rel in FENCE:
                continue
            out[rel] = ("link", os.readlink(path)) if path.is_symlink() else path.read_bytes()
    return out


def snapshot(repo: Path) -> Before:
    """What must survive an attack: take it after the attack's set-up outside the fence, before the try."""
    return Before(head(repo), len(rows(repo)), user_files(repo))


def assert_outside_fence_unchanged(repo: Path, before: Before) -> None:
    now = user_files(repo)
    changed = sorted(rel for rel in before.files if now.get(rel) != before.files[rel])
    added = sorted(set(now) - set(before.files))
    assert not changed and not added, f"files outside the fence changed: {changed}; appeared: {added}"


def assert_not_kept_nothing_lost(repo: Path, before: Before, code: int | None = None, *,
                                 marker: str | None = None, refused_ok: bool = False) -> dict | None:
    """The promise after an attack (see the module docstring). Returns the new row (None when refused).

    ``refused_ok``: exit 3 (refused before anything moved) is also a right answer; then no row is
    written and the work tree (the attack included) is left exactly as it was.
    """
    new = rows(repo)[before.rows:]
    assert head(repo) == before.head, f"HEAD moved to {head(repo)[:10]} (the attack was committed and kept?)"
    assert not any(r.get("status") == "keep" for r in new), f"the attack was kept: {new[-1].get('reason')}"
    assert_outside_fence_unchanged(repo, before)
    if code == 3 and refused_ok:
        assert new == [], f"a refused command wrote rows: {new}"
        return None
    assert code is None or code not in (0, 3), f"exit {code}: expected a revert (1) or a crash (4)"
    assert len(new) == 1, f"expected exactly one new row, got {len(new)}: {[r.get('status') for r in new]}"
    row = new[0]
    assert row.get("patch"), f"the row names no patch: {row}"
    patch = repo / row["patch"]
    assert patch.is_file() and patch.stat().st_size > 0, f"the named patch {row['patch']} is missing or empty"
    if marker is not None:
        assert marker in patch.read_text(encoding="utf-8", errors="replace"), f"{marker!r} not in the saved patch"
    for rel in FENCE:
        path = repo / rel
        assert not path.is_symlink(), f"{rel} is still a symlink after the revert"
        assert path.read_bytes() == git_blob(repo, "HEAD", rel), f"{rel} differs from HEAD after the revert"
    return row


def git_blob(repo: Path, rev: str, rel: str) -> bytes:
    return subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=repo, check=True, capture_output=True).stdout


# --- repositories ---------------------------------------------------------------------------------


def start_session(repo: Path, *, repeats: int = 2, timeout: str = "300", init_args: tuple[str, ...] = (),
           **session_edits) -> None:
    """``init`` and ``baseline``; ``session_edits``: session.yaml keys set between the two. The
    iteration budget is 300 s: at 60 s a kept try (its re-check runs every pair) crashed on a timeout
    on a loaded 2-core machine (a fresh clone's full run, tests/test_loop_windows.py)."""
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--timeout", timeout, *init_args)
    assert code == 0, data
    allow_no_gpu(repo)
    if session_edits:
        edit_session(repo, **session_edits)
    code, data, _ = call(repo, "baseline", "--repeats", str(repeats))
    assert code == 0, data


@pytest.fixture(scope="module")
def _template(tmp_path_factory) -> Path:
    """One initialised, baselined simulated repo per module; each test works on a copy of it."""
    repo = build_tilegym_like_repo(tmp_path_factory.mktemp("template"))
    start_session(repo)
    return repo


@pytest.fixture
def repo(_template, tmp_path) -> Path:
    """A copy of the baselined template (a session in its own directory), checked by ``status``.

    Copying saves ~6 s of init and baseline per test. If the loop ever records absolute paths that
    make a copied session unusable, ``status`` says so and the session is built from scratch.
    """
    copy = tmp_path / "fakegym"
    shutil.copytree(_template, copy, symlinks=True)
    if call(copy, "status")[0] != 0:
        shutil.rmtree(copy)
        copy = build_tilegym_like_repo(tmp_path)
        start_session(copy)
    return copy


# --- processes the children leave behind ----------------------------------------------------------


def _proc_text(pid: str, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tagged_pids(tag: str, repo: Path) -> list[int]:
    """Live processes (other than us) started for this test: our tag or the repo's path in their
    environment or command line. Linux only."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        status = _proc_text(entry.name, "status")
        if "State:\tZ" in status:
            continue
        text = _proc_text(entry.name, "environ") + _proc_text(entry.name, "cmdline")
        if tag in text or str(repo) in text:
            found.append(int(entry.name))
    return found


def wait_until(predicate, timeout_s: float = 20.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def reap():
    """Kill, by pid, whatever processes a test left behind (after its assertions have run)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# --- interrupts: a killed run and its resume -------------------------------------------------------


SIGNALS = {"KILL": signal.SIGKILL, "INT": signal.SIGINT, "TERM": signal.SIGTERM}


def killed_by(code: int, name: str) -> bool:
    sig = SIGNALS[name]
    return code in (-sig, 128 + sig) or (name in ("INT", "TERM") and code == 130)


def recorded_groups(repo: Path) -> list[int]:
    """The process groups the killed run recorded in its iteration state (what resume must end)."""
    try:
        return [pgid for pgid, _started in json.loads((repo / "sandbox/iteration.json").read_text())["children"]]
    except (OSError, ValueError, KeyError):
        return []


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def resume_and_check(repo: Path, before: Before, tag: str, reap: list[int], *, marker: str) -> dict:
    # The children's environment is built from an allow-list in the sandbox, so the tag may not
    # reach them: the groups the run recorded are checked too.
    groups = recorded_groups(repo)
    code, data, _ = call(repo, "resume")
    assert code == 0 and data.get("consistent"), data
    assert not (repo / "sandbox/cutile-perf.lock").exists()
    with contextlib.suppress(AssertionError):  # a killed child may take a moment to go
        wait_until(lambda: not tagged_pids(tag, repo), 3.0)
    left = tagged_pids(tag, repo)
    reap.extend(left)
    assert not left, f"resume left the killed run's children running: {left}"
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not any(_group_alive(g) for g in groups), 3.0)
    assert not [g for g in groups if _group_alive(g)], f"resume left recorded process groups running: {groups}"
    iterations = [r["iteration"] for r in rows(repo)]
    assert len(iterations) == len(set(iterations)), f"duplicate rows: {iterations}"
    row = assert_not_kept_nothing_lost(repo, before, marker=marker)
    code, data, _ = call(repo, "resume")  # idempotent
    assert code == 0 and data.get("consistent") and len(rows(repo)) == before.rows + 1
    return row
