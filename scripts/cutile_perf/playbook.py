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
)}

# The orders of the upstream perf-knob catalog, with a middle ground for balanced kernels.
PRIORITY: dict[str, tuple[str, ...]] = {
    "memory-bound": ("A", "B", "C", "F", "G", "E", "H", "K", "J", "L"),
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
