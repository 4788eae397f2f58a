"""Reading what a child may have written, without letting it hang, crash or fill the harness.

A pytest child runs the candidate's code, and that code can replace any file it can write (its
run report, its log's content, a checkout file, the compile cache) by a FIFO (``open`` blocks
until a writer comes: forever), a device (``/dev/zero`` never ends), a symlink to a file
elsewhere, or a file of many gigabytes. Every harness read of such a path goes through here:

* the path is ``lstat``-ed first: only a regular file is opened, never a FIFO, a device, a socket
  or a folder; a symlink only when the caller names the folder it must stay in (``within``);
* it is opened ``O_NONBLOCK`` and checked again on the descriptor (a swap between the ``lstat``
  and the ``open`` is caught), so no read can block;
* every read is capped: whole reads refuse a file over ``limit`` bytes, tails ``seek`` to the end,
  digests of big files use the inode's identity instead of its bytes.

``Unsafe`` (an ``OSError``) carries a one-line reason: callers that already handle a missing or
unreadable file need nothing new.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator

MB = 1 << 20
_CHUNK = MB
# A line longer than this (a child printing without newlines) is cut: only its end is kept.
_LONGEST_LINE = 64 * 1024

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symlink"))


class Unsafe(OSError):
    """A child-writable file the harness will not read as it is (its reason is one line)."""


def kind(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO", "a regular file", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else "a special file")


def _inside(path: str, folder: str | os.PathLike) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def open_regular(path: str | os.PathLike, *, within: str | os.PathLike | None = None) -> int:
    """A read-only descriptor of the regular file ``path``; ``Unsafe`` for anything else.

    ``within``: a symlink is followed only when its target lies inside this folder (a committed
    link of a checkout); without it, a symlink is refused. Never blocks."""
    path = os.fspath(path)
    info = os.lstat(path)  # FileNotFoundError as usual
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    if stat.S_ISLNK(info.st_mode):
        if within is None or not _inside(path, within):
            raise Unsafe(f"{path}: a symlink" + (" out of its folder" if within is not None else "")
                         + "; not read")
        path = os.path.realpath(path)
        info = os.stat(path)
    else:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    if not stat.S_ISREG(info.st_mode):
        raise Unsafe(f"{path}: {kind(info.st_mode)}, not a regular file; not read")
    fd = os.open(path, flags)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode):  # replaced between the lstat and the open
            raise Unsafe(f"{path}: {kind(now.st_mode)}, not a regular file; not read")
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_regular(path: str | os.PathLike) -> bool:
    """Whether ``path`` itself (not a link's target) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_bytes(path: str | os.PathLike, limit: int, *, within: str | os.PathLike | None = None) -> bytes:
    """The whole file; ``Unsafe`` when it is over ``limit`` bytes (nothing is read then)."""
    fd = open_regular(path, within=within)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if size > limit:
            raise Unsafe(f"{os.fspath(path)}: {size / MB:.1f} MB, over the {limit / MB:g} MB this file may hold; not read")
        data = fh.read(limit + 1)  # a file still growing is cut at the limit, never read on
    if len(data) > limit:
        raise Unsafe(f"{os.fspath(path)}: grew past the {limit / MB:g} MB this file may hold; not read")
    return data


def read_text(path: str | os.PathLike, limit: int, *, within: str | os.PathLike | None = None) -> str:
    return read_bytes(path, limit, within=within).decode("utf-8", errors="replace")


def size_of(path: str | os.PathLike) -> int:
    """The size of a regular file (0 for anything else or nothing)."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


def tail_bytes(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The last ``max_bytes`` bytes of the file, read from the end (a 300 MB log costs what its tail does)."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        fh.seek(max(size - max_bytes, 0))
        return fh.read(max_bytes)


def tail_text(path: str | os.PathLike, chars: int) -> str:
    """About the last ``chars`` characters of a text file ("" when it cannot be read safely)."""
    try:
        data = tail_bytes(path, chars)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")[-chars:]


def _blocks_from_end(path: str | os.PathLike, max_bytes: int) -> Iterator[bytes]:
    """The file's last ``max_bytes`` as blocks of whole lines, last block first, read in 1 MB chunks:
    the memory held is a chunk and one line (of a line over 64 KB, its first 64 KB)."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        end = os.fstat(fd).st_size
        stop = max(end - max_bytes, 0)
        partial = b""  # the start of the block after this one: a line begun in this chunk
        while end > stop:
            begin = max(end - _CHUNK, stop)
            fh.seek(begin)
            block = fh.read(end - begin) + partial
            end = begin
            cut = block.find(b"\n") + 1 if end > stop else 0
            partial = block[:cut][:_LONGEST_LINE]
            yield block[cut:]
        if partial:
            yield partial


def matching_lines(path: str | os.PathLike, pattern: re.Pattern[bytes], max_bytes: int, count: int) -> list[str]:
    """The last ``count`` lines that ``pattern`` matches within the last ``max_bytes`` of the file,
    in file order; [] when it cannot be read safely. ``pattern`` (bytes) starts with ``\\n``: each
    block is searched with a newline before it, and the literal start lets ``re`` skip ahead from
    one newline to the next (about 10x faster than ``^`` with ``re.MULTILINE`` on a 300 MB log)."""
    found: list[bytes] = []
    try:
        for block in _blocks_from_end(path, max_bytes):
            hits = [m.group(0)[1:] for m in pattern.finditer(b"\n" + block)]
            found = hits + found
            if len(found) >= count:
                found = found[-count:]
                break
    except OSError:
        return []
    return [line.decode("utf-8", errors="replace") for line in found]


def lines(path: str | os.PathLike, limit: int) -> Iterator[str]:
    """The file's lines, read streaming (never the whole file at once); ``Unsafe`` first when it is
    over ``limit`` bytes."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if size > limit:
            raise Unsafe(f"{os.fspath(path)}: {size / MB:.1f} MB, over the {limit / MB:g} MB this file may hold; not read")
        read = 0
        for raw in fh:
            read += len(raw)
            if read > limit:
                raise Unsafe(f"{os.fspath(path)}: grew past the {limit / MB:g} MB this file may hold; not read")
            yield raw.decode("utf-8", errors="replace").rstrip("\n")


def copy_into(path: str | os.PathLike, out, limit: int) -> int:
    """Append the file's bytes to the open binary file ``out`` in chunks (at most ``limit``, then a
    line that says how much was left out); returns the bytes copied. A file that cannot be read
    safely is named in one line instead."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        out.write(f"cutile-perf: not copied: {exc}\n".encode())
        return 0
    copied = 0
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if size > limit:  # the end holds pytest's summary: keep that
            out.write(f"cutile-perf: {size - limit} bytes of this output left out, its last {limit} kept\n".encode())
            fh.seek(size - limit)
        while copied < limit and (chunk := fh.read(min(_CHUNK, limit - copied))):
            out.write(chunk)
            copied += len(chunk)
    return copied


def digest(path: str | os.PathLike, hash_limit: int = 256 * MB) -> str | None:
    """A fingerprint of what ``path`` holds that changes whenever its content can have changed, or
    None when there is nothing there: sha256 of a regular file up to ``hash_limit`` bytes (read in
    chunks); above it, the file's identity (inode, size, and its ctime, which no process can set
    back); ``link:<target>`` for a symlink (never followed); ``<kind>`` for a FIFO, device, socket
    or folder (never opened)."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(info.st_mode):
        return "link:" + os.readlink(path)
    if not stat.S_ISREG(info.st_mode):
        return kind(info.st_mode)
    if info.st_size > hash_limit:
        return f"large:{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_ctime_ns}:{info.st_mtime_ns}"
    h = hashlib.sha256()
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        read = 0
        while read <= hash_limit and (chunk := fh.read(_CHUNK)):
            h.update(chunk)
            read += len(chunk)
    return h.hexdigest()


def under(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` resolves to ``folder`` or below it."""
    return _inside(os.fspath(path), folder)

