"""The persistent tuning cache: one JSON file per key, written atomically.

Concurrency: each writer writes a private temp file in the same directory and ``os.replace``s it
into place, so a reader sees either the old file or the new one, never a half-written one, and
two processes tuning the same key both leave a valid file (the last one wins).
Staleness: a changed kernel, GPU, toolchain or space gives a different key, so an old entry is
never found; an entry whose stored parts or config do not match is ignored (and overwritten).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutile_perf.store import atomic
from cutile_perf.tune.config import Config, Trial

ENTRY_SCHEMA = 1


@dataclass(frozen=True)
class CacheEntry:
    config: Config
    trials: tuple[Trial, ...]
    parts: dict[str, Any]


class TuneCache:
    """Directory of ``<sha256>.json`` entries. All methods are safe to call from many processes."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str, parts: dict[str, Any], space: list[Config] | None = None) -> CacheEntry | None:
        """The entry for ``key``, or None when absent, unreadable, corrupt or stale."""
        try:
            data = json.loads(self.path(key).read_text(encoding="utf-8"))
            if data.get("schema") != ENTRY_SCHEMA or data.get("parts") != parts:
                return None
            config = Config(data["config"])
            trials = tuple(Trial.from_json(t) for t in data.get("trials", []))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # a corrupt entry is just a miss; re-tuning overwrites it
        if space is not None and config not in space:
            return None
        return CacheEntry(config, trials, parts)

    def store(self, key: str, parts: dict[str, Any], config: Config, trials: list[Trial] | tuple[Trial, ...]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"schema": ENTRY_SCHEMA, "parts": parts, "config": config.to_json(),
                              "trials": [t.to_json() for t in trials]}, sort_keys=True, indent=1)
        atomic.write_text(self.path(key), payload)  # concurrent writers: the last replace wins whole
        return self.path(key)
