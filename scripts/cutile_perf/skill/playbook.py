"""The optimization playbook as data: what each item is, and the order to try them per kernel class.

``status`` and ``init`` use it to say what to try next; matching a tried optimization to an item
is by keyword (or by the item letter, e.g. ``try "B: persistent grid"``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    letter: str
    name: str
    keywords: tuple[str, ...]


PLAYBOOK: dict[str, Item] = {i.letter: i for i in (
    Item("A", "TMA loads/stores instead of gather/scatter", ("tma", "gather", "scatter", "ct.load")),
    Item("B", "persistent scheduling (grid = SMs x occupancy)", ("persistent",)),
    Item("C", "autotune occupancy / num_ctas / tiles (exhaustive_search)", ("autotun", "exhaustive", "occupancy",
                                                                          "num_ctas", "search space")),
    Item("D", "TF32 for fp32 MMA", ("tf32",)),
    Item("E", "latency hints on loads/stores", ("latency",)),
    Item("F", "allow_tma=False on stores", ("allow_tma",)),
    Item("G", "tile size", ("tile size", "tile_size", "block size", "block_size", "tile m", "tile n", "tile k")),
    Item("H", "flush_to_zero / approximate division", ("ftz", "flush_to_zero", "approx")),
    Item("I", "GROUP_SIZE_M swizzle", ("group_size", "swizzle")),
    Item("J", "token-dependency mitigation", ("token",)),
    Item("K", "batch small copy kernels", ("batch",)),
    Item("L", "custom plan from profiling", ("custom", "profil")),
    Item("M", "read each input once (whole row in one tile)", ("read once", "one pass", "single read", "whole row",
                                                              "whole-row", "read x once")),
    Item("N", "fewer, cheaper edge checks", ("edge", "check_bounds", "padding mode", "padding_mode")),
    Item("Q", "fewer instructions per element (1/n, FMAs)", ("instruction", "fma", "1/n", "reciprocal")),
    Item("R", "long 16-bit rows: one read, kept in 16 bits", ("long row", "long-row", "16-bit row", "half row")),
)}

# Compute-bound and balanced: the orders of the upstream perf-knob catalog. Memory-bound: the
# order of effect measured on the bundled row kernels on the H200 (optimization-playbook.md,
# entry P): reading each input once did most, then the occupancy hint, cheaper arithmetic, one
# CTA per row block and register stores; TMA changed nothing once loads were 16 bytes wide.
PRIORITY: dict[str, tuple[str, ...]] = {
    "memory-bound": ("M", "C", "H", "B", "F", "Q", "R", "N", "G", "A", "E", "K", "J", "L"),
    "balanced": ("A", "C", "G", "B", "E", "F", "H", "I", "J", "L"),
    "compute-bound": ("D", "G", "C", "I", "B", "E", "H", "J", "L"),
}


def priority(bound: str) -> list[Item]:
    return [PLAYBOOK[letter] for letter in PRIORITY.get(bound, PRIORITY["memory-bound"])]


def matches(item: Item, optimization: str) -> bool:
    text = optimization.lower()
    if re.match(rf"\s*{item.letter.lower()}\s*[:.)-]", text):
        return True
    return any(word in text for word in item.keywords)


def remaining(bound: str, tried: list[str]) -> list[Item]:
    """The priority list without the items some tried optimization already covers."""
    return [item for item in priority(bound) if not any(matches(item, t) for t in tried)]


def render_priority(bound: str) -> str:
    return " -> ".join(f"{i.letter} {i.name}" for i in priority(bound))
