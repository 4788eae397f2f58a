"""Configurations and trial results: the values every other tuning module passes around.

A ``Config`` is an immutable, hashable set of named values. Entry hints (``occupancy``,
``num_ctas``, ``opt_level``, ``num_worker_warps``) go to ``kernel.replace_hints``; every other
field (tile sizes, flags) is for the caller's ``grid_fn`` / ``args_fn``.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cutile_perf.errors import UsageError
from cutile_perf.judge.stats import median

# The CompilerOptions fields of cuda-tile 1.7 that replace_hints accepts.
HINT_NAMES = ("num_ctas", "occupancy", "opt_level", "num_worker_warps")


class Config(Mapping):
    """An immutable configuration: ``Config(TILE_M=128, occupancy=2)``; ``cfg.TILE_M``; ``cfg["TILE_M"]``."""

    __slots__ = ("_items", "_hash", "__dict__")

    def __init__(self, _values: Mapping[str, Any] | None = None, /, **values: Any):
        merged = {**(_values or {}), **values}
        for name, value in merged.items():
            # JSON round-trips (the persistent cache) must give back an equal config.
            if not isinstance(value, (int, float, str, bool)) and value is not None:
                raise UsageError(f"config field {name}={value!r}: only int, float, str, bool or None values are allowed")
        object.__setattr__(self, "_items", tuple(sorted(merged.items())))
        object.__setattr__(self, "_hash", hash(self._items))
        # Fields become plain instance attributes: ``cfg.TILE_M`` in a user's grid_fn/args_fn runs on
        # every launch, and a normal attribute hit is several times cheaper than ``__getattr__``.
        # A field named like a method (``keys``, ``hints``) stays reachable only as ``cfg["keys"]``.
        fast = self.__dict__
        for name, value in self._items:
            if name.isidentifier() and not hasattr(Config, name):
                fast[name] = value

    def __getattr__(self, name: str) -> Any:
        for key, value in object.__getattribute__(self, "_items"):
            if key == name:
                return value
        raise AttributeError(f"config has no field {name!r} (fields: {', '.join(self.keys()) or 'none'})")

    def __setattr__(self, name, value):
        raise AttributeError("Config is immutable; use cfg.replace(...)")

    def __getitem__(self, name: str) -> Any:
        for key, value in self._items:
            if key == name:
                return value
        raise KeyError(name)

    def __iter__(self):
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if isinstance(other, Config):
            return self._items == other._items
        return NotImplemented

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"

    def __reduce__(self):
        return (Config, (dict(self._items),))

    def replace(self, **changes: Any) -> Config:
        return Config(dict(self._items), **changes)

    def hints(self) -> dict[str, Any]:
        """The fields that are entry hints, for ``kernel.replace_hints(**cfg.hints())``."""
        return {k: v for k, v in self._items if k in HINT_NAMES}

    def params(self) -> dict[str, Any]:
        """The fields that are not hints (tile sizes and the like)."""
        return {k: v for k, v in self._items if k not in HINT_NAMES}

    def label(self) -> str:
        """A short stable name for tables: ``TILE_M=128 occupancy=2``."""
        return " ".join(f"{k}={v}" for k, v in self._items) or "(default)"

    def to_json(self) -> dict[str, Any]:
        return dict(self._items)


def as_config(value: Config | Mapping[str, Any] | Any) -> Config:
    """Accept a Config, a mapping or a SimpleNamespace (TileGym's config type)."""
    if isinstance(value, Config):
        return value
    if isinstance(value, Mapping):
        return Config(dict(value))
    if hasattr(value, "__dict__"):
        return Config(dict(vars(value)))
    raise UsageError(f"cannot use {value!r} as a config: expected Config, dict or SimpleNamespace")


def as_space(configs: Iterable[Any]) -> list[Config]:
    """A list of distinct configs in the given order (duplicates would be compiled and timed twice)."""
    space: list[Config] = []
    seen: set[Config] = set()
    for item in configs:
        cfg = as_config(item)
        if cfg not in seen:
            seen.add(cfg)
            space.append(cfg)
    if not space:
        raise UsageError("the search space is empty", hint="check the arch filters and num_ctas constraints")
    return space


def space_hash(space: Sequence[Config]) -> str:
    """sha256 of the ordered config list: a changed space never reuses an old tuning result."""
    blob = json.dumps([c.to_json() for c in space], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Trial:
    """One evaluated config. ``times`` are milliseconds; ``None`` with ``error`` set when it failed.

    ``error`` is one of ``compile``, ``timeout``, ``launch``, ``pruned`` (lost a quick probe by far,
    not timed further); ``detail`` holds the message tail.
    """

    config: Config
    times: tuple[float, ...] | None = None
    error: str | None = None
    detail: str = ""
    compile_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.times)

    @property
    def score(self) -> float:
        """Median time in ms; failures score +inf so they simply lose."""
        if not self.ok:
            return float("inf")

        return median(self.times)

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_json(), "times": list(self.times) if self.times else None,
                "error": self.error, "detail": self.detail[-2000:], "compile_s": self.compile_s}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Trial:
        times = data.get("times")
        return Trial(Config(data["config"]), tuple(times) if times else None, data.get("error"),
                     data.get("detail", ""), data.get("compile_s"))


def best_trial(trials: Iterable[Trial]) -> Trial | None:
    """The successful trial with the lowest median, or None when every one failed."""
    ok = [t for t in trials if t.ok]
    return min(ok, key=lambda t: t.score) if ok else None
