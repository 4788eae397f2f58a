"""Which commit on a branch holds a given commit's change after the branch was rewritten.

An amend, a reword or a rebase gives the kept commit a new sha; ``same_change_in`` finds its twin
by tree (byte for byte) or by ``git patch-id`` (the same diff from another parent). Runs git only
through the pinned handle ``git_ops.open_repo`` returns.
"""
from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING

from cutile_perf.store.git_ops import tree_of

if TYPE_CHECKING:
    import git


def _log_patches(repo: git.Repo, *revs: str) -> bytes:
    """``git log -p`` of ``revs`` as bytes, in the form ``git patch-id`` reads (no colour, no
    external diff or textconv driver, no rename detection: the same change always reads the same)."""
    return repo.git.log("-p", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--format=commit %H",
                        *revs, stdout_as_string=False, strip_newline_in_stdout=False)


def patch_ids(repo: git.Repo, *revs: str) -> dict[str, str]:
    """commit -> ``git patch-id --stable`` of its change, for the commits ``git log revs`` lists
    (merges and empty commits have no patch and are left out)."""
    patches = _log_patches(repo, *revs)
    if not patches.strip():
        return {}
    # GitPython hands ``istream`` to the child as its stdin: it must be a real file.
    with tempfile.TemporaryFile() as fh:
        fh.write(patches)
        fh.seek(0)
        out = repo.git.patch_id("--stable", istream=fh)
    ids = {}
    for line in out.splitlines():
        patch, _, commit = line.partition(" ")
        if commit:
            ids[commit] = patch
    return ids


def same_change_in(repo: git.Repo, commit: str, tip: str, limit: int) -> tuple[str, str] | None:
    """The commit reachable from ``tip`` but not from ``commit`` that holds ``commit``'s change, and
    how it was found: ``"same tree"`` (every file byte for byte: a reworded or amended-in-place
    commit), else ``"same patch"`` (the same diff from its own parent: a rebase). Newest first, among
    the ``limit`` newest such commits; None when none holds it (its content was changed too)."""
    listed = repo.git.log(f"--max-count={limit}", "--format=%H %T", tip, "--not", commit).split("\n")
    candidates = [tuple(line.split()) for line in listed if line.strip()]
    if not candidates:
        return None
    tree = tree_of(repo, commit)
    for sha, their_tree in candidates:
        if their_tree == tree:
            return sha, "same tree"
    wanted = patch_ids(repo, "-1", commit).get(commit)
    if wanted is None:
        return None
    theirs = patch_ids(repo, f"--max-count={limit}", tip, "--not", commit)
    return next(((sha, "same patch") for sha, _ in candidates if theirs.get(sha) == wanted), None)
