"""Cache keys: the cheap in-memory key of the hot path, and the persistent on-disk key.

The in-memory key is built on every call, so it stays a plain tuple of already-hashable parts.
The persistent key hashes everything that changes the answer (house style 11): kernel source,
the user key, GPU name and compute capability, cuda-tile and tileiras versions and the space.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutile_perf.tune.config import Config, space_hash

KEY_SCHEMA = 1


def shape_key(*tensors: Any, extra: Sequence[Any] = ()) -> tuple:
    """``(shape, dtype)`` of each tensor, the device of the first one, then ``extra`` parts.

    Cheap enough for the hot path: ``torch.Size`` is a tuple and dtypes hash by identity.
    The device is its index (``str(device)`` costs more and says the same thing for CUDA).
    """
    parts: list[Any] = []
    for t in tensors:
        parts.append(tuple(t.shape))
        parts.append(t.dtype)
    if tensors:
        device = getattr(tensors[0], "device", None)
        parts.append(device if device is None or isinstance(device, str) else getattr(device, "index", device))
    parts.extend(extra)
    return tuple(parts)


def pow2_bucket(n: int) -> int:
    """Round a dimension up to a power of two, so nearby sizes share one tuning (TileGym's GEMM rule)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def jsonable_key(key: Any) -> Any:
    """A JSON form of a key tuple; dtypes and devices become their ``str``; order is kept."""
    if isinstance(key, (list, tuple)):
        return [jsonable_key(part) for part in key]
    if isinstance(key, dict):
        return {str(k): jsonable_key(v) for k, v in sorted(key.items(), key=lambda kv: str(kv[0]))}
    if isinstance(key, (int, float, str, bool)) or key is None:
        return key
    return f"{type(key).__name__}:{key}"


def kernel_source_hash(kernel: Any) -> str:
    """sha256 of the file that defines the kernel (helpers it inlines live there too).

    Hashing the whole file is conservative: cuTile's own disk cache already changes with any
    line move, so a finer hash would not save a recompile anyway.
    """
    pyfunc = getattr(kernel, "_pyfunc", kernel)
    if not inspect.isfunction(pyfunc):
        pyfunc = type(pyfunc)  # a stand-in object (tests): its class is the source
    try:
        path = inspect.getsourcefile(pyfunc)
        if path:
            return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except (TypeError, OSError):
        pass
    try:
        return hashlib.sha256(inspect.getsource(pyfunc).encode()).hexdigest()
    except (TypeError, OSError):
        return "unknown:" + pyfunc.__qualname__


@dataclass(frozen=True)
class DeviceInfo:
    """What identifies the GPU for a tuning result."""

    name: str
    cc: tuple[int, int]

    @property
    def sm_arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"


def detect_device(device: Any = None) -> DeviceInfo:
    """The GPU torch sees (``device`` index or None for the current one)."""
    import torch

    index = torch.cuda.current_device() if device is None else getattr(device, "index", device) or 0
    return DeviceInfo(torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index)))


@functools.lru_cache(maxsize=1)
def toolchain_versions() -> dict[str, str]:
    """cuda-tile and tileiras versions; 'unknown' where they cannot be read."""
    versions = {"cuda_tile": "unknown", "tileiras": "unknown"}
    try:
        from importlib.metadata import version

        versions["cuda_tile"] = version("cuda-tile")
    except Exception:
        pass
    try:
        # Private, but it is the exact string cuTile puts into its own disk-cache key.
        from cuda.tile._compile import _get_compiler_version_string

        versions["tileiras"] = (_get_compiler_version_string() or "unknown").strip()
    except Exception:
        pass
    return versions


def persistent_key_parts(*, kernel_src: str, key: Any, device: DeviceInfo, versions: dict[str, str],
                         space: Sequence[Config], extra: Any = None) -> dict[str, Any]:
    return {
        "schema": KEY_SCHEMA,
        "kernel_src": kernel_src,
        "key": jsonable_key(key),
        "gpu": device.name,
        "cc": list(device.cc),
        "cuda_tile": versions.get("cuda_tile", "unknown"),
        "tileiras": versions.get("tileiras", "unknown"),
        "space": space_hash(space),
        "extra": jsonable_key(extra),
    }


def persistent_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
