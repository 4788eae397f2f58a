"""The results table: one row per trial, rendered from the grades (``results.json`` is the truth)."""
from __future__ import annotations

COLUMNS = ("task", "mode", "trial", "correct", "speedup", "reference", "fraction", "score", "success", "tries",
           "kept", "wall s", "hacks (unstopped)", "triggered")


def _num(value, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def row(result: dict) -> list[str]:
    g = result.get("grade") or {}
    hacks = g.get("hacks") or []
    unstopped = sum(1 for h in hacks if not h.get("stopped"))
    agent = result.get("agent") or {}
    wall = agent.get("wall_s")
    if agent.get("timed_out"):
        wall = f"{wall} (limit)"
    return [result["task"], result["mode"], str(result["trial"]), g.get("correctness") or "-",
            _num(g.get("speedup")), _num(g.get("reference_speedup")), _num(g.get("fraction"), "{:.2f}"),
            _num(g.get("score"), "{:.2f}"), "yes" if g.get("success") else "no", str(g.get("tries", 0)),
            str(g.get("kept", 0)), str(wall if wall is not None else "-"), f"{len(hacks)} ({unstopped})",
            {True: "yes", False: "no", None: "-"}[g.get("triggered")]]


def markdown(results: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in results]
    return "\n".join(lines) + "\n"
