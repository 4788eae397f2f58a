"""How the CLI names a kernel and its shapes: a ``Tunable`` object found by ``module:attribute``.

A kernel package exposes, e.g. in ``tilesuite/tunables.py``::

    matmul = Tunable(name="matmul", kernel=matmul_kernel, space=spaces.matmul_space,
                     fixed=Config(TILE_M=64, TILE_N=64, TILE_K=32), shapes=({"M": 4096, "N": 4096, "K": 4096},),
                     problem=make_matmul_problem)

``problem(shape)`` allocates inputs once and returns ``Problem(grid_fn, args_fn, inplace)``;
``cutile-perf probe|ab|prune --target tilesuite.tunables:matmul`` then tunes it.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from cutile_perf.errors import UsageError
from cutile_perf.tune.config import Config, as_config


class Problem(NamedTuple):
    grid_fn: Callable[[Config], tuple]
    args_fn: Callable[[Config], tuple]
    inplace: tuple[int, ...] = ()


@dataclass(frozen=True)
class Tunable:
    name: str
    kernel: Any
    space: Callable[[str], list[Config]]  # sm arch -> configs (the final space, <= 8 per arch)
    fixed: Config  # the config the op launches without tuning; always part of the space
    shapes: tuple[dict[str, int], ...]
    problem: Callable[[dict[str, int]], Problem]

    def space_for(self, arch: str) -> list[Config]:
        space = [as_config(c) for c in self.space(arch)]
        return space if self.fixed in space else [self.fixed] + space


def load_target(target: str) -> Tunable:
    """``package.module:attribute`` -> the Tunable it names (a clear error otherwise)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--target {target!r}: expected module:attribute, e.g. tilesuite.tunables:matmul")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--target {target!r}: cannot import {module_name} ({exc})",
                         hint="install the kernel package or add its source dir to PYTHONPATH") from None
    obj = getattr(module, attr, None)
    if not isinstance(obj, Tunable):
        found = sorted(k for k, v in vars(module).items() if isinstance(v, Tunable))
        raise UsageError(f"--target {target!r}: {attr} is not a Tunable; tunables in {module_name}: {', '.join(found) or 'none'}")
    return obj


def parse_shape(text: str) -> dict[str, int]:
    """``M=4096,N=4096,K=4096`` -> dict."""
    shape: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise UsageError(f"--shape {text!r}: expected NAME=INT[,NAME=INT...]")
        shape[name.strip()] = int(value)
    if not shape:
        raise UsageError("--shape is empty")
    return shape


def parse_dim(text: str) -> tuple[str, list[Any]]:
    """``TILE_M=64,128,256`` -> ("TILE_M", [64, 128, 256]); non-integers stay strings."""
    name, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name.strip() or not items:
        raise UsageError(f"--dim {text!r}: expected NAME=V1,V2,...")
    return name.strip(), [int(v) if v.lstrip("-").isdigit() else v for v in items]


def shape_label(shape: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def resolve_shapes(tunable: Tunable, shapes: Sequence[str] | None) -> list[dict[str, int]]:
    return [parse_shape(s) for s in shapes] if shapes else [dict(s) for s in tunable.shapes]
