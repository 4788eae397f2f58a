"""Atomic file writes: a reader, or a kill -9 mid-write, sees the old file or the new one, never half.

Every file the harness owns (session.yaml, perf_results.md, report.md, patches, the plot, tuning
cache entries, installed skill files) is written through here: a private temp file in the same
directory, flushed and fsync'd, then ``os.replace``d over the target (atomic on POSIX and Windows).
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def replacing(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Yield a file opened in ``mode`` whose content replaces ``path`` when the block ends cleanly."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
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
