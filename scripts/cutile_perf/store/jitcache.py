"""The session's cuTile compile cache: kept from one loop command to the next, guarded in between.

Why it exists. cuTile keeps compiled kernels in a disk cache (``cutile_cache``: one SQLite file,
``cache.db``, rows of key -> cubin). The key hashes the kernel's TileIR bytecode, and that bytecode
embeds the absolute path of the kernel's source file. The harness used to write every pristine
checkout into a fresh temporary directory, so every key was new: each pytest child recompiled every
kernel specialization it launched, in every ``try``, unchanged kernels included. Two pieces make
unchanged kernels hit again:

* checkouts go to stable slots (``pristine.slot_root``): the n-th checkout a loop command builds in
  a repository always has the same path, so an unchanged kernel has the same bytecode and key;
* the children's ``CUDA_TILE_CACHE_DIR`` is the session's own ``sandbox/jit-cache/``, never the
  user's global cache, which anything on the machine may write.

The manifest (what the loop's own children compiled) lives beside the cache folder, never in it
(``sandbox/jit-cache-manifest.json``): the children write into the cache folder, and a manifest
there could be rewritten, or replaced by a folder that failed every later command. A session made
before it moved has ``jit-cache/manifest.json``: ``guarded`` moves it out once (``migrate``).

The guard. A cached cubin runs instead of compiling the committed source, so an entry planted by
someone else would be measured as if the commit had produced it. Every loop command therefore
starts with ``drop_unrecorded``: an entry that is not in the manifest, or whose cubin changed since
it was recorded, is deleted (and reported) before any child starts; the command ends with
``record``, which writes what its own children compiled into the manifest.

What the guard does not stop (docs/design.md, "Limits"): a process that writes an entry while a loop
command runs, or that rewrites the manifest along with the cache. ``verify`` is the backstop: it
compiles everything afresh in an empty cache of its own (``fresh_dir``), from the commits alone.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from cutile_perf.store import atomic, remove_tree, safe_read

CACHE_DIR = "jit-cache"  # under sandbox/
DB_FILE = "cache.db"  # cutile_cache's file name (tests/test_jitcache.py checks it against the package)
MANIFEST_SUFFIX = "-manifest.json"  # sandbox/jit-cache-manifest.json, beside the cache folder
OLD_MANIFEST_FILE = "manifest.json"  # inside the cache folder, where sessions before the move kept it
MANIFEST_LIMIT = 64 * safe_read.MB
ENV = "CUDA_TILE_CACHE_DIR"
# SQLite opens these beside the database file: a child could leave a FIFO there too.
_SIDE_FILES = ("-wal", "-shm", "-journal")


def session_dir(sandbox: Path) -> Path:
    return sandbox / CACHE_DIR


def manifest_path(cache_dir: Path) -> Path:
    """Where the manifest of ``cache_dir`` lives: beside it, out of the children's reach."""
    return cache_dir.parent / f"{cache_dir.name}{MANIFEST_SUFFIX}"


def _special(path: Path) -> bool:
    """Something other than a regular file is at ``path`` (a FIFO, a folder, a link, a device)."""
    return os.path.lexists(path) and not safe_read.is_regular(path)


def entries(cache_dir: Path) -> dict[str, str] | None:
    """key -> sha256 of its cubin, for every row of the cache; ``{}`` without a cache, ``None`` when
    the file cannot be read as cuTile's cache (corrupt, not SQLite, or not a regular file: SQLite
    would block on a FIFO, follow a link out of the folder)."""
    db = cache_dir / DB_FILE
    if not os.path.lexists(db):
        return {}
    if _special(db) or any(_special(Path(f"{db}{side}")) for side in _SIDE_FILES):
        return None
    try:
        # Read-only: looking must never create or migrate the file.
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)) as conn:
            return {key: hashlib.sha256(blob).hexdigest() for key, blob in conn.execute("SELECT key, blob FROM cache")}
    except sqlite3.Error:
        return None


def _manifest(cache_dir: Path) -> dict[str, str]:
    path = manifest_path(cache_dir)
    if not os.path.lexists(path):  # a session made before the move (``migrate`` has not run yet)
        path = cache_dir / OLD_MANIFEST_FILE
    try:
        data = json.loads(safe_read.read_text(path, MANIFEST_LIMIT))
    except (OSError, ValueError):
        return {}  # no manifest (first command), a broken one or not a file: nothing is vouched for
    recorded = data.get("entries") if isinstance(data, dict) else None
    return {k: v for k, v in recorded.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(recorded, dict) else {}


def unrecorded(found: dict[str, str], recorded: dict[str, str]) -> list[str]:
    """The keys of ``found`` that ``recorded`` does not vouch for: new keys, or the same key with another cubin."""
    return sorted(key for key, digest in found.items() if recorded.get(key) != digest)


def _look(cache_dir: Path) -> tuple[dict[str, str], list[str]] | None:
    """(every entry, the keys the manifest does not vouch for), or None for an unreadable cache file."""
    found = entries(cache_dir)
    return None if found is None else (found, unrecorded(found, _manifest(cache_dir)))


def state(cache_dir: Path) -> dict:
    """What ``status`` shows: how many kernels the cache holds, and how many of them the next loop
    command will drop (``unreadable`` when the file is not cuTile's cache)."""
    looked = _look(cache_dir)
    if looked is None:
        return {"kernels": 0, "unrecorded": 0, "unreadable": True}
    return {"kernels": len(looked[0]), "unrecorded": len(looked[1]), "unreadable": False}


def drop_unrecorded(cache_dir: Path) -> list[str]:
    """Delete every entry the manifest does not vouch for; return their keys (``["cache.db"]`` when the
    whole file was unreadable and was removed)."""
    looked = _look(cache_dir)
    if looked is None:
        for name in (DB_FILE, *(DB_FILE + side for side in _SIDE_FILES)):
            remove_tree.remove(cache_dir / name)  # a folder or a FIFO in its place too
        return [DB_FILE]
    stray = looked[1]
    if stray:
        with closing(sqlite3.connect(cache_dir / DB_FILE, timeout=5.0)) as conn:
            conn.executemany("DELETE FROM cache WHERE key = ?", [(key,) for key in stray])
            conn.commit()
    return stray


def record(cache_dir: Path) -> None:
    """Vouch for what the cache holds now (called when a loop command's children have all ended)."""
    found = entries(cache_dir)
    if found is None:  # a child left a broken file: vouch for nothing, the next command removes it
        found = {}
    atomic.write_text(manifest_path(cache_dir), json.dumps({"entries": found}, indent=0, sort_keys=True) + "\n")


def migrate(cache_dir: Path) -> None:
    """Move a manifest left inside the cache folder (sessions before the move) out of it, once.

    It vouches for what it did before the move; whatever else lies there under its name (a folder,
    a FIFO, a link: a child's) vouches for nothing and is removed."""
    old = cache_dir / OLD_MANIFEST_FILE
    if not os.path.lexists(old):
        return
    if not os.path.lexists(manifest_path(cache_dir)):
        try:
            text = safe_read.read_text(old, MANIFEST_LIMIT)
        except OSError:
            text = None
        if text is not None:
            atomic.write_text(manifest_path(cache_dir), text)
    remove_tree.remove(old)


@contextmanager
def guarded(cache_dir: Path) -> Iterator[list[str]]:
    """A loop command's use of the session cache: drop what no earlier command recorded, yield the
    dropped keys, and record the cache when the block ends (also on an error or Ctrl-C)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    migrate(cache_dir)
    dropped = drop_unrecorded(cache_dir)
    try:
        yield dropped
    finally:
        record(cache_dir)


@contextmanager
def fresh_dir() -> Iterator[Path]:
    """An empty cache for one command (``verify``), removed afterwards: nothing compiled before is reused."""
    with remove_tree.temporary_folder("cutile-perf-jit-") as path:  # the children wrote in it: any depth
        yield path
