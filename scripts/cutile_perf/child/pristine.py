"""Throw-away checkouts built only from committed content: what every test stage runs in.

A stage never runs in the user's work tree. Its checkout is written blob by blob from git's object
store (``git cat-file --batch``): protected paths from the session's base commit, fenced paths
from the candidate commit, raw blob bytes (no filter, no hook), interpreter start-up and bytecode
files left out even when committed (``skipped_by_rule``), a symlink only when it points inside the
checkout. So nothing the work tree or ``.git`` holds besides the two commits can change what runs
(``docs/design.md``, "Checkouts, protected files and the compile cache").

``child_env`` then puts the checkout's package roots first on ``PYTHONPATH``, so an editable
install of the same package elsewhere is never imported, and keeps every child off bytecode it did
not compile itself from a committed source (``child_env``, ``sweep``).
"""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cutile_perf.output import say
from cutile_perf.store import git_ops, remove_tree

SKIPPED_NAMES = ("sitecustomize.py", "usercustomize.py")
SKIPPED_SUFFIXES = (".pth", ".pyc", ".pyo")
_MODE_LINK = "120000"
_MODE_EXEC = "100755"
_MODE_SUBMODULE = "160000"


@dataclass(frozen=True)
class Checkout:
    root: Path
    skipped: tuple[str, ...]  # committed paths deliberately not written (start-up files, bytecode, links out)
    written: tuple[str, ...] = ()  # the committed files the checkout holds: what a child may not change
    links: tuple[str, ...] = ()  # committed symlinks recreated in it (each points inside the checkout)
    # The cuTile compile cache its children use (jitcache.py); None: whatever the environment says.
    compile_cache: Path | None = None
    # The bytecode of installed code its boxed children read (``child.bytecode``); None: see child_env.
    installed_bytecode: Path | None = None

    def remove(self) -> None:
        why = remove_tree.remove_quietly(self.root)  # a child's 3,000-level folder included
        if why:
            say(f"warning: could not remove the checkout {why}")


def skipped_by_rule(path: str) -> bool:
    name = PurePosixPath(path).name
    return name in SKIPPED_NAMES or name.endswith(SKIPPED_SUFFIXES)


def _in_fence(path: str, fence: Iterable[str]) -> bool:
    return any(path == f or (f.endswith("/") and path.startswith(f)) for f in fence)


def composed_entries(g, protected_from: str, fenced_from: str, fence: Iterable[str]) -> list[git_ops.TreeEntry]:
    """The files of the checkout: fenced paths from ``fenced_from``, every other path from ``protected_from``."""
    fence = tuple(fence)
    protected = [e for e in git_ops.tree_entries(g, protected_from) if not _in_fence(e.path, fence)]
    fenced = [e for e in git_ops.tree_entries(g, fenced_from) if _in_fence(e.path, fence)]
    return sorted(protected + fenced, key=lambda e: e.path)


def slot_root(repo: Path, index: int) -> Path | None:
    """The stable path of a repository's ``index``-th checkout in a loop command, or None when the
    per-user folder holding them is not safely ours (then the checkout gets a fresh random path).

    Stable, because cuTile's compile cache keys embed the kernel file's absolute path (jitcache.py):
    the same path from one command to the next is what lets an unchanged kernel hit the cache.
    Outside the repository, like every checkout, and one folder per repository.
    """
    base = user_folder()
    if base is None:
        return None
    tag = hashlib.sha256(str(Path(repo).resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return base / tag / f"slot-{index}"


def user_folder() -> Path | None:
    """``cutile-perf-checkouts-<uid>`` in the temp folder, made private to this user (checkout
    slots, the installed-code bytecode of ``child.bytecode``), or None when a folder of that name is
    not safely ours."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    base = Path(tempfile.gettempdir()) / f"cutile-perf-checkouts-{uid}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(base)
    except OSError:
        return None
    # A shared temp folder: a folder someone else made (or a link) under our name is not used.
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != uid):
        return None
    return base


def emptied_slot(root: Path) -> Path:
    """``root`` emptied of what an earlier command left (even after a kill -9: any depth, links
    removed, never followed), or, when it cannot be emptied, a fresh temporary folder in its place,
    named in a one-line warning: one bad slot never stops a command."""
    why = remove_tree.remove_quietly(root)
    if why is None:
        try:
            root.mkdir(parents=True)
            return root
        except OSError as exc:
            why = f"{root}: {exc.strerror or exc}"
    fresh = Path(tempfile.mkdtemp(prefix="cutile-perf-checkout-"))
    say(f"warning: checkout slot abandoned ({why}); this command uses {fresh} instead (its compiled kernels "
        "are not reused)")
    return fresh


def build(g, *, protected_from: str, fenced_from: str, fence: Iterable[str], root: Path | None = None) -> Checkout:
    """Write the composed tree into ``root`` (emptied first: a slot from ``slot_root``) or, without
    it, into a new temporary directory; either way outside the repository."""
    root = Path(tempfile.mkdtemp(prefix="cutile-perf-checkout-")) if root is None else emptied_slot(root)
    entries = composed_entries(g, protected_from, fenced_from, fence)
    files = [e for e in entries if e.mode not in (_MODE_SUBMODULE,) and not skipped_by_rule(e.path)]
    skipped = [e.path for e in entries if e not in files]
    written, links = [], []
    for entry in files:
        target = root / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        content = git_ops.blob_bytes(g, entry.sha)
        if entry.mode == _MODE_LINK:
            link = content.decode("utf-8", "surrogateescape")
            resolved = (target.parent / link).resolve()
            if os.path.isabs(link) or not resolved.is_relative_to(root.resolve()):
                skipped.append(entry.path)
                continue
            target.symlink_to(link)
            links.append(entry.path)
            continue
        target.write_bytes(content)
        written.append(entry.path)
        if entry.mode == _MODE_EXEC:
            target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return Checkout(root, tuple(sorted(skipped)), tuple(written), tuple(links))


def sweep(checkout: Checkout) -> list[str]:
    """Remove from ``checkout`` every file and folder its build did not write, and return their
    paths: each child starts from the checkout as built. What an earlier child of the same checkout
    left (pytest's cache, a test's output, or a planted ``conftest.py`` or ``__pycache__``) never
    reaches the next one, which is what lets a boxed child read installed packages' own bytecode
    (``child_env``): the only writable place on its import path is this checkout."""
    built = {*checkout.written, *checkout.links}
    kept_dirs = {str(parent) for path in built for parent in PurePosixPath(path).parents}
    removed: list[str] = []
    for folder, subfolders, files in os.walk(checkout.root):
        rel = PurePosixPath(os.path.relpath(folder, checkout.root))
        for name in list(subfolders):
            path, full = str(rel / name) if str(rel) != "." else name, os.path.join(folder, name)
            if path in built:  # a committed link to a folder: kept, never followed
                subfolders.remove(name)
            elif path not in kept_dirs or os.path.islink(full):
                subfolders.remove(name)
                remove_tree.remove(full)  # a link is unlinked, a folder removed at any depth
                removed.append(path + "/")
        for name in files:
            path = str(rel / name) if str(rel) != "." else name
            if path not in built:
                os.unlink(os.path.join(folder, name))
                removed.append(path)
    return sorted(removed)


def package_root(checkout_root: Path, rel: str) -> Path:
    """The folder a fenced module is imported from: the nearest ancestor that is not a package.

    ``src/tilegym/ops/cutile/rms_norm.py`` -> ``src`` (``tilegym`` and below hold ``__init__.py``).
    """
    folder = (checkout_root / rel).parent
    while folder != checkout_root and (folder / "__init__.py").exists():
        folder = folder.parent
    return folder


def package_roots(checkout_root: Path, fenced_files: Iterable[str]) -> list[Path]:
    """The directories to put first on ``PYTHONPATH`` so the fenced modules import from the checkout
    (each once, in the fenced files' order, the checkout's root last unless one of them is it)."""
    found = [package_root(checkout_root, rel) for rel in fenced_files if rel.endswith(".py")]
    return list(dict.fromkeys([*found, checkout_root]))


def module_name(checkout_root: Path, rel: str) -> str | None:
    """The dotted name under which the checkout imports the fenced file ``rel`` (None: not Python)."""
    if not rel.endswith(".py"):
        return None
    parts = list((checkout_root / rel).relative_to(package_root(checkout_root, rel)).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or None


def import_path(checkout_root: Path, fenced_files: Iterable[str], inherited: str = "") -> dict[str, str]:
    """``{"PYTHONPATH": ...}`` with the checkout's package roots first, then ``inherited``.

    Every child that imports the fenced code gets it: init's and survey's collections and runs as
    well as the measured runs, so an uninstalled TileGym checkout (``import tilegym`` from ``src/``)
    is found by all of them or by none, never refused by init and then measured by ``try``.
    """
    roots = [str(p) for p in package_roots(checkout_root, fenced_files)]
    return {"PYTHONPATH": os.pathsep.join([*roots, *([inherited] if inherited else [])])}


def child_env(checkout_root: Path, fenced_files: Iterable[str], pycache: Path | None,
              base_env: dict[str, str]) -> dict[str, str]:
    """``base_env`` for a child running in the checkout: its package roots first, and its bytecode.

    ``pycache``: a fresh per-run folder for all bytecode, so no ``__pycache__`` anywhere is read; the
    price is every installed module (torch's thousands) compiled from source again in every child,
    seconds each on a GPU host. ``None``: installed packages' own bytecode is read and nothing is
    written. Only for a child that is boxed and alone in a swept checkout (``measure``): the box
    makes everything but the checkout read-only, and ``sweep`` removed any bytecode an earlier
    child left there, so every ``.pyc`` it can find was compiled by the package's installer."""
    bytecode = {"PYTHONPYCACHEPREFIX": str(pycache)} if pycache is not None else {"PYTHONDONTWRITEBYTECODE": "1"}
    return {
        **base_env,
        **import_path(checkout_root, fenced_files, base_env.get("PYTHONPATH", "")),
        **bytecode,
        "PYTHONNOUSERSITE": "1",
    }


def is_inside(path: str | os.PathLike, root: Path) -> bool:
    try:
        return Path(os.path.realpath(path)).is_relative_to(Path(os.path.realpath(root)))
    except (OSError, ValueError):
        return False
