"""Every git operation cutile-perf performs, as small named functions (finding a rewritten
commit's twin by its patch lives beside it, in ``git_rewrites``).

This is the only module that imports GitPython. Each repository handle is pinned to its own
``.git`` directory, work tree and index (``GIT_DIR``/``GIT_WORK_TREE``/``GIT_INDEX_FILE`` are
overridden), so a harness started from a git hook or an IDE that exports ``GIT_DIR`` never writes
into the wrong repository.

Paths exchanged with callers are repository-relative POSIX strings.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import git

from cutile_perf.errors import UsageError

# Settings of the target repository that would run its own programs inside our git commands, or
# make their output lie, forced off for every command we run (``git -c`` beats every config file):
# a hook could rewrite the kernel right after a revert or a commit, an fsmonitor program runs on
# every status (and can hang it), an external diff or a textconv driver makes every saved patch junk.
_NEUTRAL_CONFIG = {
    "core.hooksPath": os.devnull,
    "core.fsmonitor": "false",
    "core.untrackedCache": "false",
    "diff.external": "",
    "core.pager": "cat",
    "core.askPass": "",
    "credential.helper": "",
}
# No git command of ours takes long on a kernel repository; one that does is stuck (a lock held by
# a child, a filesystem that hangs) and must not wedge the loop.
GIT_TIMEOUT_S = 120.0
# Used only when the target repository has no committer identity (fresh CI machines).
_FALLBACK_IDENTITY = {
    "GIT_AUTHOR_NAME": "cutile-perf",
    "GIT_AUTHOR_EMAIL": "cutile-perf@localhost",
    "GIT_COMMITTER_NAME": "cutile-perf",
    "GIT_COMMITTER_EMAIL": "cutile-perf@localhost",
}


def open_repo(path: Path) -> git.Repo:
    """The repository whose work tree contains ``path``, with a clean git environment."""
    try:
        repo = _Repo(Path(path).resolve(), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UsageError(f"{path} is not inside a git repository", "pass --repo <kernel repo>") from None
    if repo.bare or repo.working_tree_dir is None:
        raise UsageError(f"{path} is a bare git repository; a work tree is needed")
    git_dir = Path(repo.git_dir)
    config = {f"GIT_CONFIG_KEY_{i}": key for i, key in enumerate(_NEUTRAL_CONFIG)}
    config.update({f"GIT_CONFIG_VALUE_{i}": value for i, value in enumerate(_NEUTRAL_CONFIG.values())})
    repo.git.update_environment(
        GIT_DIR=str(git_dir), GIT_WORK_TREE=str(repo.working_tree_dir), GIT_INDEX_FILE=str(git_dir / "index"),
        GIT_CONFIG_COUNT=str(len(_NEUTRAL_CONFIG)), GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", **config,
    )
    return repo


class _TimedGit(git.Git):
    """Every command is killed after ``GIT_TIMEOUT_S`` (GitPython's per-call option, made the
    default), unless it streams its output, where GitPython cannot time it."""

    def execute(self, command, **kwargs):
        if not kwargs.get("as_process") and not kwargs.get("output_stream"):
            kwargs.setdefault("kill_after_timeout", GIT_TIMEOUT_S)
        return super().execute(command, **kwargs)


class _Repo(git.Repo):
    GitCommandWrapperType = _TimedGit


def init_repo(path: Path, message: str) -> git.Repo:
    """Make ``path`` a new repository whose first commit holds every file under it (``.gitignore`` honoured).

    Refuses a directory that already is a repository's top level: its history is not ours to restart.
    """
    path = Path(path).resolve()
    if (path / ".git").exists():
        raise UsageError(f"{path} is already a git repository")
    # GitPython's init would inherit an exported GIT_DIR and initialise that repository instead.
    git.Repo.init(path, env={"GIT_DIR": str(path / ".git"), "GIT_WORK_TREE": str(path)})
    repo = open_repo(path)
    commit_paths(repo, ["."], message)
    return repo


def _output_or_none(command, *args: str) -> str | None:
    """The command's output, or None when git exits non-zero (the answer is "no such thing")."""
    try:
        return command(*args)
    except git.GitCommandError:
        return None


def _succeeds(command, *args: str) -> bool:
    """Whether git exits 0: the commands whose exit status is the answer (``--is-ancestor``, ``--quiet``)."""
    return _output_or_none(command, *args) is not None


def root(repo: git.Repo) -> Path:
    return Path(repo.working_tree_dir)


def head(repo: git.Repo) -> str:
    """The full sha of HEAD."""
    return repo.git.rev_parse("HEAD")


def short(repo: git.Repo, sha: str) -> str:
    return repo.git.rev_parse("--short", sha)


def current_branch(repo: git.Repo) -> str | None:
    """The checked-out branch, or None on a detached HEAD."""
    name = repo.git.rev_parse("--abbrev-ref", "HEAD")
    return None if name == "HEAD" else name


def has_commits(repo: git.Repo) -> bool:
    """False in a freshly ``git init``-ed repository: there is no HEAD to branch from or return to."""
    return _succeeds(repo.git.rev_parse, "--verify", "-q", "HEAD^{commit}")


def branch_name_error(repo: git.Repo, name: str) -> str | None:
    """None when git accepts ``name`` as a new branch name, else git's reason (``check-ref-format``)."""
    try:
        # "@{-1}" passes and names the previous branch instead: only a name that maps to itself is new.
        accepted = repo.git.check_ref_format("--branch", name)
    except git.GitCommandError:
        return "git does not accept it as a branch name (git check-ref-format --branch)"
    return None if accepted == name else f"git reads it as {accepted!r}, not as a new branch name"


def branch_exists(repo: git.Repo, name: str) -> bool:
    return bool(repo.git.branch("--list", name).strip())


def create_branch(repo: git.Repo, name: str) -> None:
    """Create ``name`` at HEAD and check it out (the tree is clean, so nothing moves)."""
    repo.git.checkout("-b", name)


def _status_entries(repo: git.Repo) -> list[tuple[str, str]]:
    """(two-letter status, path) for every changed, staged or untracked file; renames give both paths."""
    out = repo.git.status("--porcelain=v1", "-z", "--untracked-files=all", strip_newline_in_stdout=False)
    fields = out.split("\0")
    entries: list[tuple[str, str]] = []
    i = 0
    while i < len(fields):
        item = fields[i]
        i += 1
        if len(item) < 4:
            continue
        code, path = item[:2], item[3:]
        entries.append((code, path))
        if code[0] in "RC":  # -z puts the rename source in the next field
            entries.append((code, fields[i]))
            i += 1
    return entries


def changed_paths(repo: git.Repo) -> list[str]:
    """Every path with an uncommitted change, staged or not, including untracked (not ignored) files."""
    return sorted({path for _, path in _status_entries(repo)})


def tracked_changes(repo: git.Repo) -> list[str]:
    """Paths of tracked files with uncommitted changes (untracked files are not counted)."""
    return sorted({path for code, path in _status_entries(repo) if code != "??"})


def _has_identity(repo: git.Repo) -> bool:
    try:
        return bool(repo.git.config("user.email").strip())
    except git.GitCommandError:
        return False


def _stage(repo: git.Repo, paths: list[str]) -> None:
    """``git add -A`` of ``paths``, skipping those in neither the work tree nor the index: a deletion
    already staged matches no file, and ``git add`` would fail on it (the diff still shows it)."""
    indexed = set(_path_list(repo.git.ls_files("-z", "--", *paths, strip_newline_in_stdout=False)))
    addable = [p for p in paths if p in indexed or (root(repo) / p).exists() or (root(repo) / p).is_symlink()]
    if addable:
        repo.git.add("-A", "--", *addable)


def commit_paths(repo: git.Repo, paths: Iterable[str], message: str) -> str:
    """Stage exactly ``paths`` (additions, edits, deletions) and commit them; returns the new sha."""
    paths = list(paths)
    _stage(repo, paths)
    env = None if _has_identity(repo) else _FALLBACK_IDENTITY
    # --no-verify: the target's hooks (formatters, linters) must not rewrite the measured change.
    # --only -- paths: a file the user staged while the tests ran must not be swept into the commit.
    repo.git.commit("-q", "--no-verify", "--allow-empty", "-m", message, "--only", "--", *paths, env=env)
    return head(repo)


def _diff_bytes(repo: git.Repo, *args: str) -> bytes:
    # Bytes, not str: a kernel holding non-UTF-8 text (a Latin-1 comment) is diffed as text, and a
    # decoded patch could not be written back byte for byte, so the revert that needs it would fail.
    return repo.git.diff("--no-ext-diff", "--no-textconv", *args, stdout_as_string=False, strip_newline_in_stdout=False)


def diff_patch(repo: git.Repo, base: str, paths: Iterable[str]) -> bytes:
    """A binary-safe patch (bytes) from ``base`` to the work tree for ``paths``, untracked files included.

    The paths are staged first (``git add -A``) so that a new file inside the fence is in the patch;
    callers use this right before a revert, when the index is about to be reset anyway.
    """
    paths = list(paths)
    if not paths:
        return b""
    _stage(repo, paths)
    return _diff_bytes(repo, "--cached", "--binary", base, "--", *paths)


def _path_list(out: str) -> list[str]:
    """Paths from a ``-z`` listing. Without ``-z`` git quotes non-ASCII names ("caf\\303\\251.py"),
    which then match no file: a revert would skip or delete a fenced file with such a name."""
    return [p for p in out.split("\0") if p]


def paths_in_commit(repo: git.Repo, sha: str, paths: Iterable[str]) -> list[str]:
    """Those of ``paths`` that exist as files in commit ``sha``."""
    paths = list(paths)
    if not paths:
        return []
    return _path_list(repo.git.ls_tree("-r", "-z", "--name-only", sha, "--", *paths, strip_newline_in_stdout=False))


def restore_paths(repo: git.Repo, sha: str, paths: Iterable[str]) -> None:
    """Make ``paths`` in the work tree and index equal to commit ``sha``; files absent there are deleted.

    Touches nothing else, so work outside the fence survives even if it appeared mid-iteration.
    """
    paths = list(paths)
    if not paths:
        return
    present = paths_in_commit(repo, sha, paths)
    if present:
        repo.git.checkout(sha, "--", *present)
    work = root(repo)
    tracked_now = set(_path_list(repo.git.ls_files("-z", "--", *paths, strip_newline_in_stdout=False)))
    for rel in set(paths) - set(present):
        target = work / rel
        if rel in tracked_now:
            repo.git.rm("-q", "--cached", "--ignore-unmatch", "--", rel)
        if target.is_file() or target.is_symlink():
            target.unlink()


def reset_to(repo: git.Repo, sha: str, paths: Iterable[str]) -> None:
    """Move the branch back to ``sha`` and restore ``paths`` to it, leaving every other file alone.

    ``reset --mixed`` moves HEAD and the index only; the fenced files are then checked out. A plain
    ``reset --hard`` would also wipe an unrelated edit the user made while the iteration ran.
    """
    paths = list(paths)
    repo.git.reset("-q", "--mixed", sha)
    restore_paths(repo, sha, paths)


def head_ref(repo: git.Repo) -> str | None:
    """The ref HEAD points at (``refs/heads/<branch>``), or None when HEAD is detached."""
    return _output_or_none(repo.git.symbolic_ref, "-q", "HEAD")


def branch_sha(repo: git.Repo, branch: str) -> str | None:
    return _output_or_none(repo.git.rev_parse, "--verify", "-q", f"refs/heads/{branch}^{{commit}}")


def index_matches(repo: git.Repo, commit: str, paths: Iterable[str]) -> bool:
    """Whether the index holds ``commit``'s version of ``paths`` (other staged files are the user's)."""
    return _succeeds(repo.git.diff, "--no-ext-diff", "--cached", "--quiet", commit, "--", *paths)


def moved_since(repo: git.Repo, branch: str, commit: str, paths: Iterable[str]) -> str | None:
    """What moved since the harness committed ``commit`` on ``branch``: HEAD re-pointed, the branch
    moved, or the index changed for ``paths``; None when all three are exactly as committed."""
    ref = head_ref(repo)
    if ref != f"refs/heads/{branch}":
        return f"HEAD points at {ref or 'a detached commit'}, not refs/heads/{branch}"
    sha = branch_sha(repo, branch)
    if sha != commit:
        return f"branch {branch} moved to {sha or 'nothing'} from {commit}"
    if not index_matches(repo, commit, list(paths)):
        return "the index no longer holds the candidate commit's version of the fenced files"
    return None


def point_head_at(repo: git.Repo, branch: str) -> None:
    """Make HEAD the session branch again (a child may have re-pointed it), touching no other ref."""
    if head_ref(repo) != f"refs/heads/{branch}":
        repo.git.symbolic_ref("HEAD", f"refs/heads/{branch}")


def changed_between(repo: git.Repo, older: str, newer: str) -> list[str]:
    return _path_list(repo.git.diff("-z", "--name-only", older, newer, strip_newline_in_stdout=False))


def is_ancestor(repo: git.Repo, older: str, newer: str) -> bool:
    return _succeeds(repo.git.merge_base, "--is-ancestor", older, newer)


def create_branch_at(repo: git.Repo, name: str, sha: str) -> None:
    """A new branch ``name`` at ``sha``, leaving HEAD and the work tree alone; UsageError with git's
    reason when git refuses it (the name is taken, or clashes with an existing ref's folder)."""
    try:
        repo.git.branch("--no-track", name, sha)
    except git.GitCommandError as exc:
        reason = (exc.stderr or "").strip().splitlines()
        raise UsageError(f"git could not create branch {name}: {reason[-1] if reason else exc}") from None


def move_branch_keeping_work(repo: git.Repo, sha: str) -> None:
    """Move the checked-out branch to ``sha`` and its work tree with it (``git reset --keep``): git
    itself stops, changing nothing, where a file with a local change would have to change."""
    repo.git.reset("-q", "--keep", sha)


def commit_message(repo: git.Repo, sha: str) -> str:
    return repo.git.log("-1", "--format=%B", sha).strip()


def exclude_locally(repo: git.Repo, pattern: str, comment: str = "cutile-perf session files") -> bool:
    """Add ``pattern`` to ``.git/info/exclude`` (never committed); False when it was already there."""
    exclude = git_common_dir(repo) / "info" / "exclude"
    existing = exclude.read_text(encoding="utf-8").splitlines() if exclude.exists() else []
    if pattern in existing:
        return False
    exclude.parent.mkdir(parents=True, exist_ok=True)
    prefix = "" if not existing or existing[-1] == "" else "\n"
    with exclude.open("a", encoding="utf-8") as fh:
        fh.write(f"{prefix}# {comment}\n{pattern}\n")
    return True


@dataclass(frozen=True)
class TreeEntry:
    mode: str  # "100644", "100755", "120000" (symlink), "160000" (submodule)
    sha: str
    path: str


def tree_entries(repo: git.Repo, commit: str) -> list[TreeEntry]:
    """Every file of ``commit``'s tree, recursively, with its mode and blob sha."""
    out = repo.git.ls_tree("-r", "-z", "--full-tree", commit, strip_newline_in_stdout=False)
    entries = []
    for item in out.split("\0"):
        if item:
            meta, path = item.split("\t", 1)
            mode, _kind, sha = meta.split(" ")
            entries.append(TreeEntry(mode, sha, path))
    return entries


def blob_bytes(repo: git.Repo, sha: str) -> bytes:
    """A blob's raw bytes from the object store: no filter, no attribute conversion, no work tree."""
    return repo.odb.stream(bytes.fromhex(sha)).read()


def tree_of(repo: git.Repo, commit: str) -> str:
    return repo.git.rev_parse(f"{commit}^{{tree}}")


def amend_message(repo: git.Repo, message: str) -> str:
    """Reword HEAD, keeping its tree byte for byte (nothing is staged); returns the new sha."""
    env = None if _has_identity(repo) else _FALLBACK_IDENTITY
    tree = tree_of(repo, "HEAD")
    parents = repo.git.rev_list("--parents", "-n", "1", "HEAD").split()[1:]
    args = [a for p in parents for a in ("-p", p)]
    new = repo.git.commit_tree(tree, *args, "-m", message, env=env)
    repo.git.update_ref("-m", "cutile-perf: add trailers", "HEAD", new, env=env)
    return new


def commits_between(repo: git.Repo, older: str, newer: str) -> list[str]:
    """Shas of the commits in ``older..newer``, oldest first."""
    out = repo.git.rev_list("--reverse", f"{older}..{newer}")
    return out.split()


def git_common_dir(repo: git.Repo) -> Path:
    path = Path(repo.git.rev_parse("--git-common-dir"))
    return path if path.is_absolute() else root(repo) / path


def filtered_paths(repo: git.Repo, paths: Iterable[str]) -> list[str]:
    """Those of ``paths`` whose bytes git would change on ``add`` (clean filter, ident, eol conversion).

    For such a file the commit would not hold the code in the work tree, and a patch made through
    the index would lose the filtered lines: the loop refuses them before committing anything.
    """
    out = []
    for rel in paths:
        target = root(repo) / rel
        if not target.is_file() or target.is_symlink():
            continue
        raw = repo.git.hash_object("--no-filters", "--", rel)
        filtered = repo.git.hash_object("--", rel)
        if raw != filtered:
            out.append(rel)
    return out


def tracked_files(repo: git.Repo) -> list[str]:
    return _path_list(repo.git.ls_files("-z", strip_newline_in_stdout=False))


def blob_sha_at(repo: git.Repo, commit: str, path: str) -> str | None:
    """The blob sha of ``path`` in ``commit`` (None when absent)."""
    out = repo.git.ls_tree("-z", commit, "--", path, strip_newline_in_stdout=False)
    for item in out.split("\0"):
        if item:
            meta, _path = item.split("\t", 1)
            return meta.split(" ")[2]
    return None


def worktree_blob_sha(repo: git.Repo, path: str) -> str | None:
    """The blob sha the work-tree file would have, byte for byte (no filters); None when absent."""
    target = root(repo) / path
    if not target.is_file() or target.is_symlink():
        return None
    return repo.git.hash_object("--no-filters", "--", path)


def resolve(repo: git.Repo, rev: str) -> str:
    """The full sha of a commit named by ``rev``; ValueError naming it when git knows no such commit."""
    try:
        return repo.git.rev_parse("--verify", "-q", f"{rev}^{{commit}}")
    except git.GitCommandError:
        raise ValueError(f"{rev!r} names no commit in this repository") from None
