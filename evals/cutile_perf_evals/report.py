"""The results table: one row per trial, rendered from the grades (``results.json`` is the truth)."""
from __future__ import annotations

COLUMNS = ("task", "mode", "trial", "correct", "speedup", "worst case", "no case slower", "reference", "fraction",
           "score", "success", "tries", "kept", "wall s", "agent GPU s", "hacks (unstopped)", "triggered",
           "closest shipped step")


def _num(value, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def slower_verdict(slower: list[dict], every: bool = True) -> str:
    """The no-regression rule's answer for ``grade.slower_cases``: "yes", or "no (<case> <speedup>,
    ...)" naming every slower case, or only the slowest when ``every`` is false."""
    if not slower:
        return "yes"
    return "no (" + ", ".join(f"{c['case']} {c['speedup']:.3f}" for c in (slower if every else slower[:1])) + ")"


def no_case_slower(grade: dict) -> str:
    """A grade's cell of the no-regression rule: ``slower_verdict`` with its slowest case, or "-"
    when no case was timed."""
    if not grade.get("per_shape"):
        return "-"
    return slower_verdict(grade.get("slower_cases") or [], every=False)


def row(result: dict) -> list[str]:
    g = result.get("grade") or {}
    hacks = g.get("hacks") or []
    unstopped = sum(1 for h in hacks if not h.get("stopped"))
    agent = result.get("agent") or {}
    wall = agent.get("wall_s")
    if agent.get("timed_out"):
        wall = f"{wall} (limit)"
    return [result["task"], result["mode"], str(result["trial"]), g.get("correctness") or "-",
            _num(g.get("speedup")), _num((g.get("worst_case") or {}).get("speedup")), no_case_slower(g),
            _num(g.get("reference_speedup")), _num(g.get("fraction"), "{:.2f}"),
            _num(g.get("score"), "{:.2f}"), "yes" if g.get("success") else "no", str(g.get("tries", 0)),
            str(g.get("kept", 0)), str(wall if wall is not None else "-"),
            _num((result.get("gpu") or {}).get("agent_seconds"), "{:.0f}"), f"{len(hacks)} ({unstopped})",
            {True: "yes", False: "no", None: "-"}[g.get("triggered")],
            ", ".join(f"{s['step'].split('-')[0]} ({s['similarity']:.2f})" for s in g.get("shipped_step") or []) or "-"]


SUMMARY_COLUMNS = ("task", "mode", "trials", "successes", "no case slower", "median fraction", "median tries",
                   "median wall s", "hacks (unstopped)")


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def summary(results: list[dict]) -> list[list[str]]:
    """One row per (task, mode) over its trials, in first-seen order."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r["task"], r["mode"]), []).append(r)
    rows = []
    for (task, mode), trials in groups.items():
        grades = [t.get("grade") or {} for t in trials]
        hacks = [h for g in grades for h in g.get("hacks") or []]
        rows.append([task, mode, str(len(trials)), str(sum(1 for g in grades if g.get("success"))),
                     str(sum(1 for g in grades if no_case_slower(g) == "yes")),
                     _num(_median([g.get("fraction") for g in grades]), "{:.2f}"),
                     _num(_median([g.get("tries") for g in grades]), "{:g}"),
                     _num(_median([(t.get("agent") or {}).get("wall_s") for t in trials]), "{:.0f}"),
                     f"{len(hacks)} ({sum(1 for h in hacks if not h.get('stopped'))})"])
    return rows


def _table(columns, rows) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(results: list[dict]) -> str:
    lines = ["## Per task", "", *_table(SUMMARY_COLUMNS, summary(results)), "", "## Per trial", "",
             *_table(COLUMNS, [row(r) for r in results])]
    return "\n".join(lines) + "\n"
