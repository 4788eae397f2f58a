"""What ``screen`` prints and saves: the ranked table (``sandbox/screen.md``), its JSON, and the
``--top K`` plan for ``batch`` (``sandbox/screen-plan.yaml``). Pure: text in, text out."""
from __future__ import annotations

import yaml

from cutile_perf.loop import screen_rank
from cutile_perf.loop.screen import ScreenResult
from cutile_perf.templating import format_change

LABEL = "readings, not verdicts"
TABLE_FILE, PLAN_FILE = "screen.md", "screen-plan.yaml"


def ranked_rows(out: ScreenResult) -> list[str]:
    head = ["| rank | candidate | geomean ratio | interval | worst case | rounds | compile-check |",
            "|---|---|---|---|---|---|---|"]
    rows = []
    for n, r in enumerate(out.ranked, 1):
        compiled = out.compiled.get(r.name, ("-", ""))[0]
        rows.append(f"| {n} | {r.name} | {r.geomean:.3f} ({format_change(r.geomean - 1.0)}) | "
                    f"{r.low:.3f}-{r.high:.3f} | {r.worst_case} {r.worst:.3f} | {r.rounds} | {compiled} |")
    return head + rows if rows else []


def case_rows(ranked: list[screen_rank.Reading]) -> list[str]:
    """Per case, each ranked candidate's median ratio over the rounds."""
    if not ranked:
        return []
    cases = sorted(ranked[0].cases)
    lines = ["| case | " + " | ".join(r.name for r in ranked) + " |", "|---|" + "---|" * len(ranked)]
    lines += [f"| {case} | " + " | ".join(f"{r.cases[case]:.3f}" for r in ranked) + " |" for case in cases]
    return lines


def render(out: ScreenResult, base_short: str) -> str:
    """The markdown saved to sandbox/screen.md and printed."""
    lines = [f"# cutile-perf screen: {LABEL}", "",
             f"Latency ratio candidate/base (< 1 is faster), paired within each round against the base "
             f"{base_short} (the commit try compares against); geomean over cases of each case's median ratio; "
             f"interval: {screen_rank.INTERVAL_KIND}; {out.rounds} round(s) in {out.seconds:.0f} s"
             # Whole seconds of the JSON's tenths, so screen.md and --json never disagree (3.46 s: 3.5, "4 s").
             + (" (" + ", ".join(f"{name} {round(s, 1):.0f} s" for name, s in out.phases.items()) + ")."
                if out.phases else "."),
             "Nothing was committed and nothing was recorded in the log: decide with `cutile-perf batch` "
             "(`--top K` writes its plan).", ""]
    if out.all_cases and len(out.timed_cases) < out.all_cases:
        timed = f"Timed on {len(out.timed_cases)} of the base's {out.all_cases} cases (--cases): "
        lines[-1:-1] = [timed + f"{', '.join(out.timed_cases)}; batch decides on every case."]
    lines += ranked_rows(out) or ["No candidate could be ranked."]
    if out.dropped:
        lines += ["", "| not ranked | why |", "|---|---|"]
        lines += [f"| {name} | {state}: {' '.join(why.split())[:300]} |" for name, (state, why) in out.dropped.items()]
    if out.stopped:
        lines += ["", f"Rounds stopped early: {out.stopped}"]
    per_case = case_rows(out.ranked)
    if per_case:
        lines += ["", "Per case (median ratio over the rounds):", "", *per_case]
    return "\n".join(lines) + "\n"


def top_plan(out: ScreenResult, k: int) -> str:
    """A ``batch`` plan of the ``k`` best ranked candidates, best first."""
    files = {e.optimization: e.files for e in out.candidates}
    tries = [{"optimization": r.name, "files": dict(files[r.name])} for r in out.ranked[:k]]
    header = f"# cutile-perf screen --top {k}: the {len(tries)} best by screen's {LABEL}; batch decides them\n"
    return header + yaml.safe_dump({"tries": tries}, sort_keys=False)


def to_data(out: ScreenResult) -> dict:
    return {"label": LABEL, "base": out.base, "rounds": out.rounds, "interval": screen_rank.INTERVAL_KIND,
            "seconds": round(out.seconds, 1), "phases": {name: round(s, 1) for name, s in out.phases.items()},
            "ranked": [r.to_dict() for r in out.ranked],
            "not_ranked": {name: {"state": s, "why": why} for name, (s, why) in out.dropped.items()},
            "compile_check": {name: {"state": s, "detail": d} for name, (s, d) in out.compiled.items()},
            "stopped": out.stopped or None, "cases": {"timed": list(out.timed_cases), "of": out.all_cases},
            **({"workers": out.workers} if out.workers else {})}
