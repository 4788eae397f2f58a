"""Removing a folder a child wrote, however deep: no recursion, no path longer than a name.

``shutil.rmtree`` and ``os.walk`` recurse (Python 3.11): a child that makes a 3,000-level folder
in its checkout or its run folder raises ``RecursionError`` in the harness, which
``ignore_errors=True`` does not catch, and every later command failed on the same slot. Paths of
such a tree are also longer than the system allows (``ENAMETOOLONG``).

``remove`` walks with an explicit stack of folder descriptors and names every entry relative to
its folder's descriptor (``dir_fd``), so neither Python's stack nor a path's length grows with
the depth; a folder deeper than ``_OPEN_AT_ONCE`` is moved up to the top folder (a rename within
the tree) and emptied from there, so the descriptors held stay bounded too. Symlinks are removed,
never followed; a folder the child made unreadable is made readable first (it is ours).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from cutile_perf.output import say

_OPEN_AT_ONCE = 64
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_dir(name: str, parent_fd: int) -> int:
    """Open the folder ``name`` of ``parent_fd`` for emptying. One the child made unreadable or
    unwritable (chmod 0, 0500) is ours: it is opened up first."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent_fd, follow_symlinks=False)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    mode = os.fstat(fd).st_mode
    if mode & 0o700 != 0o700:
        with contextlib.suppress(OSError):
            os.fchmod(fd, stat.S_IMODE(mode) | 0o700)
    return fd


def _first_folder(fd: int) -> str | None:
    """Unlink every non-folder entry of the open folder ``fd`` up to its first sub-folder, whose name
    is returned (None once it holds no folder any more)."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                return entry.name
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.name, dir_fd=fd)
    return None


def _free_name(fd: int, serial: itertools.count) -> str:
    while True:
        name = f".cutile-perf-removing-{next(serial)}"
        try:
            os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            return name


def _empty(top: int) -> None:
    """Remove everything inside the open folder ``top``."""
    serial = itertools.count()
    stack: list[tuple[int, str]] = [(top, "")]  # (descriptor, its name in the folder above)
    try:
        while stack:
            fd, _ = stack[-1]
            sub = _first_folder(fd)
            if sub is None:
                if len(stack) == 1:
                    return
                done, name = stack.pop()
                os.close(done)
                os.rmdir(name, dir_fd=stack[-1][0])
            elif len(stack) >= _OPEN_AT_ONCE:
                # Too deep to hold every folder above it open: move it up, it is emptied from there.
                os.rename(sub, _free_name(top, serial), src_dir_fd=fd, dst_dir_fd=top)
            else:
                stack.append((_open_dir(sub, fd), sub))
    finally:
        for fd, _ in stack[1:]:
            os.close(fd)


def remove(path: str | os.PathLike) -> None:
    """Remove ``path`` (a folder with everything in it, or a file or a link); nothing when it is
    not there. Raises ``OSError`` when something in it cannot be removed."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        path.unlink(missing_ok=True)
        return
    parent = os.open(path.parent, _DIR_FLAGS & ~getattr(os, "O_NOFOLLOW", 0))
    try:
        top = _open_dir(path.name, parent)
        try:
            _empty(top)
        finally:
            os.close(top)
        os.rmdir(path.name, dir_fd=parent)
    finally:
        os.close(parent)


def remove_quietly(path: str | os.PathLike) -> str | None:
    """``remove``, returning why it failed (one line) instead of raising, or None."""
    try:
        remove(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None


# --- the harness's own temporary folders ------------------------------------------------------------

# A folder made by ``temporary_folder`` is named ``<prefix><pid>-<random>``: a later command can tell
# that the process that made it is gone (a kill -9 skips every ``finally``) and remove it.
_TAGGED = re.compile(r"(?P<pid>\d+)-[A-Za-z0-9_]+$")
# A folder of an older version (no pid in its name) is removed once it is this old: no command runs so long.
LEGACY_AGE_S = 24 * 3600.0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _orphaned(entry: os.DirEntry, prefix: str, now: float) -> bool:
    """Whether ``entry`` is a folder of ``prefix`` that no running process of ours owns."""
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
        return False
    tagged = _TAGGED.match(entry.name[len(prefix):])
    if tagged:
        return int(tagged["pid"]) != os.getpid() and not pid_alive(int(tagged["pid"]))
    return now - info.st_mtime > LEGACY_AGE_S


def remove_orphans(prefix: str, folder: str | os.PathLike | None = None) -> list[str]:
    """Remove the ``prefix`` folders in the temp folder that a killed command left (their maker is
    gone); returns the names of those it removed."""
    folder = folder or tempfile.gettempdir()
    now = time.time()
    try:
        with os.scandir(folder) as entries:
            found = [e for e in entries if e.name.startswith(prefix) and _orphaned(e, prefix, now)]
    except OSError:
        return []
    return [entry.name for entry in found if remove_quietly(entry.path) is None]


_swept: set[str] = set()


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[Path]:
    """A new private folder in the temp folder, removed however deep its content when the block
    ends (``remove``); the first use of ``prefix`` in a process also removes the folders of that
    prefix that killed commands left (``remove_orphans``)."""
    if prefix not in _swept:
        _swept.add(prefix)
        remove_orphans(prefix)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    try:
        yield path
    finally:
        why = remove_quietly(path)
        if why:
            say(f"warning: could not remove the temporary folder {why}")
