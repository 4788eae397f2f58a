"""Atomic file writes: a reader, or a kill -9 mid-write, sees the old file or the new one, never half.

Every file the harness owns (session.yaml, perf_results.md, report.md, patches, the plot, tuning
cache entries, installed skill files) is written through here: a temp file in the same
directory, flushed and fsync'd, then ``os.replace``d over the target (atomic on POSIX and Windows).
The temp file is given the mode a plain ``open()`` would have created (0666 less the umask, so 0644
with the usual umask 022): ``mkstemp`` makes it 0600, which left every written file private.
"""
from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process's umask, without changing it: from ``/proc/self/status`` on Linux. Elsewhere it can
    only be read by setting it, so set and restore it under a lock (other threads that create files
    meanwhile would still see the temporary value; tuning writes from threads, hence /proc first)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


@contextmanager
def replacing(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Yield a file opened in ``mode`` whose content replaces ``path`` when the block ends cleanly."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            # On the descriptor, before any byte: what the replace publishes is never 0600.
            if hasattr(os, "fchmod"):  # POSIX; Windows has no such modes
                os.fchmod(fh.fileno(), 0o666 & ~_umask())
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> Path:
    with replacing(path, "w") as fh:
        fh.write(text)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    with replacing(path, "wb") as fh:
        fh.write(data)
    return Path(path)
