"""The session: one frozen object loaded once from ``<repo>/sandbox/session.yaml`` and passed explicitly.

Also owns the sandbox layout and the lock that keeps two loop commands off the same repository.
"""
from __future__ import annotations

import fnmatch
import functools
import fcntl
import json
import math
import os
import shlex
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path, PurePosixPath

import yaml

from cutile_perf.store import atomic, remove_tree
from cutile_perf.judge.rules import Thresholds
from cutile_perf.errors import Locked, NoSession, Refused, UsageError, yaml_problem

SANDBOX = "sandbox"
SESSION_FILE = "session.yaml"
LOG_FILE = "experiments.jsonl"
RESULTS_FILE = "perf_results.md"
LOCK_FILE = "cutile-perf.lock"
SCHEMA = 1
MAX_CORRECTNESS_JOBS = 16

# The command templates. ``{python}`` is replaced by the interpreter running cutile-perf, because
# the record plugin must be importable in the child; edit session.yaml to use another interpreter.
# "not cutile_rs": `-k cutile` is a substring match and TileGym names the Rust backend cutile_rs.
CORRECTNESS_TEMPLATE = '{python} -m pytest {test} -k "test_ and cutile and not cutile_rs and not test_perf" -q'
# --print-record: the perf log shows one readable record per test, as TileGym's procedure runs it.
PERF_TEMPLATE = '{python} -m pytest {test} -k "test_perf and cutile and not cutile_rs" -q --print-record'
# What a session freezes into the log's first row: a later edit of these in session.yaml is refused.
FROZEN_KEYS = ("kernel", "kernel_files", "fence", "test", "correctness_cmd", "perf_cmd", "thresholds", "timeout_s",
               "base_commit", "branch", "require_gpu", "defence", "jit_cache", "prestart_perf", "correctness_jobs",
               "sandbox_mode")
# Keys an older cutile-perf wrote that mean nothing any more: read and ignored, so its sessions still load.
RETIRED_KEYS = frozenset({"collect_ahead"})
# How the children are isolated from the machine: "auto" (the best isolation this machine offers),
# "off" (none; init --no-sandbox). child/runner.py reads it.
SANDBOX_MODES = ("auto", "off")

# What the fence may never hold, whatever init was told or session.yaml says: the tests that judge a
# change, the files that configure pytest or the package (they choose the tests, plugins and
# options), anything under a tests/ folder, git's folder and the session's own. A change that may
# also weaken its own test proves nothing (a broken kernel plus a loosened tolerance was kept).
PROTECTED_NAMES = ("conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "setup.py", "tox.ini")
PROTECTED_PATTERNS = ("test_*.py", "*_test.py")
PROTECTED_DIRS = ("tests",)
_GLOB_CHARS = set("*?[")
_WALK_SKIPPED = {".git", "__pycache__"}


def protected_reason(rel: str, test_files: Iterable[str] = ()) -> str | None:
    """Why the repo-relative ``rel`` (a file, or a folder ending in "/") may not be in the fence; None
    when it may. ``test_files``: the session's correctness and perf test files. Pure: a folder's
    contents on disk are ``protected_inside``'s."""
    is_dir = rel.endswith("/")
    parts = PurePosixPath(rel).parts
    if not parts or parts in ((".",), ("/",)):
        return "is the whole repository"
    if parts[0] == ".git":
        return "is git's own folder"
    if parts[0] == SANDBOX:
        return "is the session's own folder (sandbox/)"
    if any(p in PROTECTED_DIRS for p in parts):
        return "is a tests/ folder" if is_dir and parts[-1] in PROTECTED_DIRS else "is under a tests/ folder"
    name = parts[-1]
    if not is_dir and (name in PROTECTED_NAMES or any(fnmatch.fnmatchcase(name, p) for p in PROTECTED_PATTERNS)):
        return "is a test or a pytest/packaging configuration file"
    clean = PurePosixPath(rel).as_posix()
    for test in test_files:
        test = PurePosixPath(test).as_posix()
        if test == clean or (is_dir and test.startswith(clean + "/")):
            return f"{'holds' if is_dir else 'is'} the session's test file {test}"
    return None


def is_scratch(path: str) -> bool:
    """Whether the repo-relative ``path`` is in sandbox/, the session's own folder."""
    return path == SANDBOX or path.startswith(SANDBOX + "/")


def fenced(path: str, fence: Iterable[str], test_files: Iterable[str] = ()) -> bool:
    """The one fence rule: whether the repo-relative ``path`` is a fenced file, one the agent may
    change and the loop commits, reverts, measures from the candidate and probe-scans.

    ``fence`` holds files and folders ("dir/", matching everything under it). A path that
    ``protected_reason`` names is never fenced, also inside a fenced folder: a test or a
    conftest.py created there would change what the tests check, and sandbox/ holds the
    session's own records."""
    if protected_reason(path, test_files):
        return False
    return any(path == entry or (entry.endswith("/") and path.startswith(entry)) for entry in fence)


def protected_inside(root: Path, rel: str) -> str | None:
    """The first repo-relative path under the folder ``rel`` ("dir/") that the fence may not hold
    (``protected_reason`` of the file), or None. What the folder holds now: a file created in it
    later is refused by ``Session.in_fence``."""
    top = Path(root) / rel
    for current, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in _WALK_SKIPPED)
        base = Path(current).relative_to(root).as_posix()
        for name in sorted(files) + [d + "/" for d in dirs]:
            found = f"{base}/{name}"
            if protected_reason(found):
                return found
    return None


def sandbox(repo: Path) -> Path:
    return Path(repo) / SANDBOX


def _one_quoted_path(text: str) -> bool:
    """True for exactly what ``shlex.quote`` makes of one path (as init writes it), nothing more."""
    try:
        parts = shlex.split(text)
    except ValueError:
        return False
    return len(parts) == 1 and shlex.quote(parts[0]) == text


@dataclass(frozen=True)
class Session:
    repo: Path
    kernel: str
    kernel_files: tuple[str, ...]
    fence: tuple[str, ...]  # files (or directories ending in "/") the agent may change
    test: str
    correctness_cmd: str
    perf_cmd: str
    thresholds: Thresholds  # parsed and checked once, when the session loads
    timeout_s: float
    base_commit: str
    branch: str
    created: str
    classification: dict = field(default_factory=dict)  # kernel_type, ai_estimate, bound
    # baseline/try refuse (exit 3) when no usable GPU is found. Only a simulated repository whose
    # fake tests need no GPU (the CPU test suite) sets it to false.
    require_gpu: bool = True
    # The bundled suite's defence run (fresh inputs, NaN-poisoned outputs, perf shapes checked) is
    # switched on for ops whose tests honour CUTILE_PERF_DEFENCE; other repos ignore the variable.
    defence: bool = False
    # Correctness children run at once, each on one share of the selected tests (the plugin's
    # CUTILE_PERF_SHARD). Correctness is not timed, so splitting it changes no measurement; the
    # perf command always runs in one child.
    correctness_jobs: int = 1
    # The perf runs that come next start as spare children beside the current run, parked before
    # any code of the repository (child/pool.py, child/warmstart.py): their start-up overlaps it.
    # init writes true unless told --no-prestart-perf; a session.yaml without the key (written
    # before it was the default) keeps false, as its baseline froze it. Done only where the
    # children run in the sandbox (StageRunner.spare_refusal says why).
    prestart_perf: bool = False
    # Children compile into the session's guarded cuTile cache (sandbox/jit-cache/) and checkouts
    # sit at stable paths, so kernels a change leaves alone are not recompiled (jitcache.py). False:
    # fresh checkout paths and the user's own cuTile cache, as before the setting existed.
    jit_cache: bool = True
    # How the children are isolated from the machine (SANDBOX_MODES): "auto", the best this machine
    # offers; "off" (init --no-sandbox), none. Read by child/runner.py.
    sandbox_mode: str = "auto"
    # How the target's perf tests time their kernels (CUPTI, CUDA events or graph replay; L2 flushed
    # or not), read statically by init (kernel/target_timing.py). Informational: the environment
    # variables that switch it are frozen with the baseline (knobs.MEASUREMENT_ENV_NAMES).
    timing: dict = field(default_factory=dict)
    schema: int = SCHEMA

    @property
    def sandbox(self) -> Path:
        return sandbox(self.repo)

    @property
    def log_path(self) -> Path:
        return self.sandbox / LOG_FILE

    @property
    def results_path(self) -> Path:
        return self.sandbox / RESULTS_FILE

    def fenced(self, path: str) -> bool:
        """Whether ``path`` is one of the session's fenced files (``fenced``): what an iteration
        owns, commits, reverts, measures and probe-scans."""
        return fenced(path, self.fence, self.test_files)

    def in_fence(self, path: str) -> bool:
        """True when ``path`` (repo-relative) may be changed by the agent: a fenced file, or session
        scratch in sandbox/ (which no iteration owns: ``fenced`` says no to it)."""
        return is_scratch(path) or self.fenced(path)

    @functools.cached_property
    def test_files(self) -> tuple[str, ...]:
        """The session's test files, repo-relative: ``test`` and every ``.py`` file its commands name."""
        return (self.test, *command_test_files(self.correctness_cmd, self.perf_cmd))

    def argv(self, which: str) -> list[str]:
        """The correctness or perf command as an argv list, placeholders filled in."""
        template = {"correctness": self.correctness_cmd, "perf": self.perf_cmd}[which]
        try:
            parts = shlex.split(template)
        except ValueError as exc:
            raise UsageError(f"session.yaml: the {which} command cannot be parsed ({exc})") from None
        values = {"python": sys.executable, "test": self.test}
        return [p.format(**values) if "{" in p else p for p in parts]

    def edited_commands(self) -> list[tuple[str, str, str]]:
        """``(key, command, init's command)`` for each test command edited away from what ``init``
        writes. Editing is allowed until the baseline, and narrowing the correctness selection to
        save GPU time is what an agent in a hurry does (seen in a live eval), so status and the
        report name it: a kept row is only as checked as the tests its command selects."""
        edited = []
        if self.correctness_cmd != CORRECTNESS_TEMPLATE:
            edited.append(("correctness_cmd", self.correctness_cmd, CORRECTNESS_TEMPLATE))
        # init's perf command is the template, with {test} replaced by a separate perf file's quoted
        # path when scaffold-perf wrote one (selection.perf_command).
        before, after = PERF_TEMPLATE.split("{test}")
        cmd = self.perf_cmd
        named = cmd[len(before):len(cmd) - len(after)] if cmd.startswith(before) and cmd.endswith(after) else ""
        if cmd != PERF_TEMPLATE and not _one_quoted_path(named):
            edited.append(("perf_cmd", self.perf_cmd, PERF_TEMPLATE))
        return edited

    def changes_from_init(self) -> list[str]:
        """One line per threshold away from its default and per test command edited away from
        init's: the one wording that status, ``batch --check`` and the eval grade show."""
        return ([f"threshold {name} {value} (default {default})" for name, value, default in self.thresholds.changed()]
                + [f"{key} edited: {command} (init wrote: {default})" for key, command, default in self.edited_commands()])

    def to_data(self) -> dict:
        data = asdict(self)
        data.pop("repo")
        data["kernel_files"] = list(self.kernel_files)
        data["fence"] = list(self.fence)
        data["thresholds"] = self.thresholds.to_dict()
        return data

    def frozen(self) -> dict:
        """The settings the baseline froze into the log: the rules of the whole session."""
        data = self.to_data()
        return {k: data[k] for k in FROZEN_KEYS}

    def to_yaml(self) -> str:
        header = ("# cutile-perf session. The commands, fence, thresholds and timeout may be edited until the\n"
                  "# baseline is recorded; after it they are frozen in the log and an edit is refused.\n"
                  "# {python} is the interpreter running cutile-perf, {test} the test file.\n")
        return header + yaml.safe_dump(self.to_data(), sort_keys=False)


def _top_level(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding ``.git`` (a directory, or a worktree's file).

    The session lives at the repository's top level: ``try`` run from ``src/`` must find it there,
    not tell the user to ``init`` again. ``start`` itself when no ``.git`` is found.
    """
    start = Path(start).resolve()
    return next((candidate for candidate in (start, *start.parents) if (candidate / ".git").exists()), start)


def command_test_files(*commands: str) -> list[str]:
    """The ``.py`` files the test commands name literally (a perf file of its own), repo-relative."""
    found = []
    for command in commands:
        try:
            parts = shlex.split(command)
        except ValueError:
            continue  # argv() reports the unparsable command when it is used
        found += [PurePosixPath(p).as_posix() for p in parts if p.endswith(".py") and "{" not in p]
    return found


def check_fence(root: Path, entries: Iterable[str], test_files: Iterable[str]) -> tuple[str, str] | None:
    """``(entry, why)`` for the first fence entry that would let the loop change a test, a test
    configuration, git's folder or the session's own files; None when every entry is allowed."""
    test_files = tuple(test_files)
    for entry in entries:
        reason = protected_reason(entry, test_files)
        if reason is None and entry.endswith("/") and (inside := protected_inside(root, entry)):
            reason = f"holds {inside}, a test or test configuration file"
        if reason:
            return entry, reason
    return None


def _check_paths(path: Path, key: str, value) -> tuple[str, ...]:
    """``kernel_files``/``fence`` as repo-relative POSIX paths, or a UsageError naming the bad entry.

    Entries are compared with git's repo-relative paths as plain strings, so an absolute path, a
    ``..`` or a glob would silently fence nothing (and a bare string would fence its characters).
    """
    if not isinstance(value, list) or not value:
        raise UsageError(f"{path}: {key} must be a non-empty list of repo-relative paths, not {value!r}")
    for entry in value:
        parts = entry.split("/") if isinstance(entry, str) else []
        bad = (not isinstance(entry, str) or not entry.strip() or entry.startswith("/") or "\\" in entry
               or any(p in {".", ".."} for p in parts) or parts[0] in {".git", SANDBOX} or _GLOB_CHARS & set(entry))
        if bad:
            raise UsageError(f"{path}: {key} entry {entry!r} is not a repo-relative file or directory/ path",
                             "no absolute path, '..', glob, .git or sandbox; e.g. src/pkg/ops/kernel.py")
    return tuple(value)


def load(repo: Path) -> Session:
    """The session of the repository containing ``repo``; NoSession when init has not run there."""
    if not (sandbox(repo) / SESSION_FILE).is_file():
        repo = _top_level(repo)
    path = sandbox(repo) / SESSION_FILE
    if not path.is_file():
        raise NoSession(f"no cutile-perf session in {repo}", "run `cutile-perf init --kernel <name>` first")
    try:
        # The C loader when libyaml is there: this file is read by every loop command.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML, {yaml_problem(exc)}") from None
    known = {f.name for f in fields(Session)} - {"repo"}
    missing = {"kernel", "kernel_files", "fence", "test", "correctness_cmd", "perf_cmd", "base_commit",
               "branch"} - set(data)
    if missing:
        raise UsageError(f"{path}: missing keys {sorted(missing)}", "re-run init or restore the file")
    unknown = set(data) - known - RETIRED_KEYS
    if unknown:
        raise UsageError(f"{path}: unknown keys {sorted(unknown)}", f"allowed: {sorted(known)}")
    timeout_s = parse_timeout(data.get("timeout_s", 600.0), f"{path}: timeout_s")
    for key in ("require_gpu", "defence", "prestart_perf", "jit_cache"):
        if not isinstance(data.get(key, False), bool):
            raise UsageError(f"{path}: {key} must be true or false")
    if not isinstance(data.get("timing", {}), dict):
        raise UsageError(f"{path}: timing must be a mapping (init writes it)")
    if data.get("sandbox_mode", "auto") not in SANDBOX_MODES:
        raise UsageError(f"{path}: sandbox_mode must be one of {', '.join(SANDBOX_MODES)}, "
                         f"not {data.get('sandbox_mode')!r}")
    if data.get("prestart_perf") and _runs_xdist(str(data["perf_cmd"])):
        # The gate holds the main pytest process; xdist workers would start timing regardless.
        raise UsageError(f"{path}: prestart_perf needs a perf command without pytest-xdist (-n/--numprocesses)",
                         "timing runs one test at a time anyway: drop -n from perf_cmd, or set prestart_perf: false")
    jobs = data.get("correctness_jobs", 1)
    if not (isinstance(jobs, int) and not isinstance(jobs, bool) and 1 <= jobs <= MAX_CORRECTNESS_JOBS):
        raise UsageError(f"{path}: correctness_jobs must be a whole number from 1 to {MAX_CORRECTNESS_JOBS}, "
                         f"not {jobs!r}")
    try:
        thresholds = Thresholds.from_dict(data.get("thresholds"))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{path}: thresholds: {exc}") from None
    for key in RETIRED_KEYS:
        data.pop(key, None)
    data.update(timeout_s=timeout_s, kernel_files=_check_paths(path, "kernel_files", data["kernel_files"]),
                fence=_check_paths(path, "fence", data["fence"]),
                thresholds=thresholds, created=str(data.get("created", "")))
    session = Session(repo=Path(repo).resolve(), **data)
    # Checked on every load, not only by init: a hand-edited (or a kernel-edited) session.yaml must
    # not widen the fence to the tests that judge the change.
    if bad := check_fence(session.repo, (*session.fence, *session.kernel_files), session.test_files):
        entry, why = bad
        raise Refused(f"{path}: fence entry {entry} {why}; the loop may not change tests or their configuration",
                      "take it out of fence (and kernel_files) in sandbox/session.yaml")
    return session


def _runs_xdist(command: str) -> bool:
    try:
        parts = shlex.split(command)
    except ValueError:
        return False  # argv() reports the unparsable command when it is used
    return any(p in ("-n", "--numprocesses", "--dist") or p.startswith(("-n=", "--numprocesses=", "--dist="))
               or (p.startswith("-n") and p[2:].isdigit()) for p in parts)


def parse_timeout(value, what: str = "--timeout") -> float:
    """A time budget in seconds: a finite number > 0 (``nan`` would disable the hang guard)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a number of seconds, not {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"{what} must be a finite number of seconds > 0, not {value!r}")
    return seconds


def parse_correctness_jobs(jobs: int, what: str = "--correctness-jobs") -> int:
    """A number of correctness children: from 1 to ``MAX_CORRECTNESS_JOBS``."""
    if not 1 <= jobs <= MAX_CORRECTNESS_JOBS:
        raise UsageError(f"{what} must be from 1 to {MAX_CORRECTNESS_JOBS}, not {jobs}")
    return jobs


def save(session: Session) -> Path:
    return atomic.write_text(session.sandbox / SESSION_FILE, session.to_yaml())


def read_lock(repo: Path) -> dict | None:
    """The lock's content ({"pid", "command"}), or None when there is no lock."""
    path = sandbox(repo) / LOCK_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"pid": -1, "command": "unreadable lock"}


def lock_is_stale(info: dict) -> bool:
    pid = info.get("pid")
    return not isinstance(pid, int) or pid <= 0 or not remove_tree.pid_alive(pid)


def _hold(repo: Path) -> int | None:
    """An exclusive ``flock`` on the repository's top directory, or None when another process holds it.

    The lock is the kernel's, on the directory itself: a file lock could be unlinked by anything
    running as the user (a child of ``try``), after which a second command would create and take a
    new one beside the first. A directory in use cannot be unlinked, and the kernel drops the lock
    when its holder dies, however it dies.
    """
    fd = os.open(repo, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextmanager
def locked(repo: Path, command: str, *, replace_stale: bool = False, **info) -> Iterator[None]:
    """Hold the repository lock for one command; a live holder means Locked, a dead one is replaced.

    The lock is an ``flock`` held on the repository's directory for the whole command (``_hold``);
    ``sandbox/cutile-perf.lock`` only says who holds it and, after a kill, what was running
    (``info``, e.g. the optimization being tried) for ``resume``. An info file whose writer is gone
    means a run was killed mid-iteration: only ``resume`` (``replace_stale=True``) may go on, after
    it has made the repository consistent.
    """
    path = sandbox(repo) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _hold(repo)
    if fd is None:
        held = read_lock(repo) or {}
        raise Locked(f"another cutile-perf command ({held.get('command', 'unknown')}, pid {held.get('pid', '?')}) "
                     f"is running on {repo}", "wait for it to finish")
    try:
        held = read_lock(repo)
        if held is not None and not replace_stale:
            if lock_is_stale(held):
                raise Locked(f"a previous `{held.get('command')}` (pid {held.get('pid')}) was killed mid-run",
                             "run `cutile-perf resume` to make the repository consistent")
            # Its writer lives but does not hold the lock: the file was left or written by something
            # else; the flock is the truth, the file is only information.
        atomic.write_text(path, json.dumps({"pid": os.getpid(), "command": command, **info}))
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the flock
