"""Throw-away commits of ``screen``'s candidates, made from git objects alone.

A stage runs a *commit* (``StageRunner`` builds its pristine checkout from the object store), so each
candidate becomes one, as ``try`` would commit it, but never on the session branch and never through
the user's work tree or index: the candidate's bytes go into the object store (``hash-object``), a
tree is written through a private index file that starts from the kept commit's tree
(``read-tree``, ``update-index --cacheinfo``, ``write-tree``), and ``commit-tree`` makes the commit.
A ref under ``refs/cutile-perf/screen/`` holds each commit while the screen runs (no reflog is kept
for refs outside heads and remotes); the refs are deleted when it ends, and any a killed screen
left are deleted when the next one starts. The objects stay unreferenced until git's own gc.
"""
from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

REF_PREFIX = "refs/cutile-perf/screen/"
# A fixed identity: the commit is never shown to anyone as the user's, and needs no git config.
IDENTITY = {"GIT_AUTHOR_NAME": "cutile-perf screen", "GIT_AUTHOR_EMAIL": "cutile-perf@localhost",
            "GIT_COMMITTER_NAME": "cutile-perf screen", "GIT_COMMITTER_EMAIL": "cutile-perf@localhost"}
REGULAR = "100644"


def _mode_of(g, commit: str, path: str) -> str:
    """The target's mode in ``commit`` (an executable kernel file stays executable), else a regular file."""
    out = g.git.ls_tree(commit, "--", path)
    mode = out.split(" ", 1)[0] if out else ""
    return mode if mode in ("100644", "100755") else REGULAR


def candidate_commit(g, parent: str, files: Sequence[tuple[str, Path]], message: str, index_file: Path) -> str:
    """A commit whose tree is ``parent``'s with each ``(target, candidate file)`` replaced by the
    file's raw bytes; the user's index and work tree are not read or written."""
    env = {"GIT_INDEX_FILE": str(index_file)}
    g.git.read_tree(parent, env=env)
    for target, source in files:
        blob = g.git.hash_object("-w", "--no-filters", "--", str(source))
        g.git.update_index("--add", "--cacheinfo", f"{_mode_of(g, parent, target)},{blob},{target}", env=env)
    tree = g.git.write_tree(env=env)
    return g.git.commit_tree(tree, "-p", parent, "-m", message, env=IDENTITY)


def screen_refs(g) -> list[str]:
    out = g.git.for_each_ref("--format=%(refname)", REF_PREFIX)
    return [line for line in out.splitlines() if line]


def delete_refs(g) -> None:
    for ref in screen_refs(g):
        g.git.update_ref("-d", ref)


@contextlib.contextmanager
def throwaway_commits(g, parent: str, candidates: Sequence[tuple[str, Sequence[tuple[str, Path]]]]
                      ) -> Iterator[dict[str, str]]:
    """``{name: commit}`` for ``(name, files)`` candidates, each held by a screen ref while in use."""
    delete_refs(g)  # left by a screen that was killed
    try:
        with tempfile.TemporaryDirectory(prefix="cutile-perf-screen-index-") as tmp:
            commits = {}
            for n, (name, files) in enumerate(candidates, 1):
                commit = candidate_commit(g, parent, files, f"cutile-perf screen candidate: {name}", Path(tmp) / "index")
                g.git.update_ref(f"{REF_PREFIX}{n}", commit)
                commits[name] = commit
        yield commits
    finally:
        delete_refs(g)
