"""Human views of the experiments log: ``perf_results.md``, ``report.md`` and the running-best plot.

``perf_results.md`` is exactly one markdown table, ``iteration | optimization | latency_ms |
correctness | status``, one row per log entry. An iteration's single ``latency_ms`` is the
**geometric mean of its per-shape medians** (``rules.combine_latency``), with 6 decimals; a crash
has no latency and shows ``-``. Renderers return strings; callers write them with
``atomic.write_text``, so a reader never sees half a file.
"""
from __future__ import annotations

from pathlib import Path

from cutile_perf.store import atomic
from cutile_perf.store.log import shape_medians
from cutile_perf.templating import load_template, markdown_cell
from cutile_perf.judge import stats
from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.rules import current_baseline, combine_latency, was_interrupted
from cutile_perf.judge.verdict import NOT_RUN
from cutile_perf.output import say

# --- perf_results.md ------------------------------------------------------------------------------


def entry_latency(entry: dict) -> float | None:
    """The entry's latency_ms, or the geomean of its shape medians when it was not stored."""
    if entry.get("latency_ms") is not None:
        return float(entry["latency_ms"])
    medians = shape_medians(entry)
    return combine_latency(medians) if medians else None


def correctness_cell(entry: dict) -> str:
    """PASS, FAIL, or "not run (<why>)" for an iteration stopped before a verdict on its tests.

    Correctness not shown to pass is a fail (a crash before the tests ran proves nothing), except when
    the iteration was interrupted: then nothing was found wrong either. Rows logged before ``not run``
    existed said FAIL for an interrupted iteration; their crash class still tells."""
    if entry.get("correctness") == "PASS":
        return "PASS"
    if entry.get("correctness") == NOT_RUN or entry.get("crash_class") == CrashClass.INTERRUPTED.value:
        return f"{NOT_RUN} ({CrashClass.INTERRUPTED.value})"  # the only class without a verdict on the tests
    return "FAIL"


def status_cell(entry: dict) -> str:
    """The row's status; "interrupted" for a row stopped before its verdict, which the log keeps as a
    crash (its class says why) but which found nothing wrong with the change."""
    if was_interrupted(entry):
        return "interrupted"
    # A claim beyond the plausibility factor was re-measured and is flagged for a human.
    return entry.get("status", "crash") + (" (review)" if entry.get("review") else "")


def render_perf_results(entries: list[dict]) -> str:
    rows = [
        {
            "iteration": e.get("iteration"),
            "optimization": e.get("optimization", ""),
            "latency_ms": entry_latency(e) if e.get("status") != "crash" else None,
            "correctness": correctness_cell(e),
            "status": status_cell(e),
        }
        for e in entries
    ]
    return load_template("perf_results.md.j2").render(rows=rows)


def write_perf_results(results_path: Path, entries: list[dict]) -> None:
    """Write ``perf_results.md`` from the log's rows, after each recorded row. A failed write only
    warns: the log is the truth, and the next recorded row (or ``report``) writes the view again."""
    try:
        atomic.write_text(results_path, render_perf_results(entries))
    except OSError as exc:
        say(f"warning: could not write {results_path.name} ({exc}); the log is intact")


# --- report.md ------------------------------------------------------------------------------------


def summarize_session(entries: list[dict]) -> dict:
    """The numbers of the report: baseline, best kept entry, per-shape and overall speedups."""
    baseline = next((e for e in entries if e.get("iteration") == 0 and e.get("status") == "keep"), None)
    best = current_baseline(entries)
    base = shape_medians(baseline) if baseline else {}
    kept = shape_medians(best) if best else {}
    shapes = [{"shape": s, "baseline": base[s], "best": kept.get(s),
               "speedup": base[s] / kept[s] if s in kept else None} for s in sorted(base)]
    speedups = [row["speedup"] for row in shapes if row["speedup"]]
    worst = min((row for row in shapes if row["speedup"]), key=lambda r: r["speedup"], default=None)
    return {
        "baseline": baseline,
        "best": best,
        "baseline_latency": entry_latency(baseline) if baseline else None,
        "best_latency": entry_latency(best) if best else None,
        "shapes": shapes,
        "geomean_speedup": stats.geomean(speedups) if speedups else None,
        "worst_speedup": worst["speedup"] if worst else None,
        "worst_shape": worst["shape"] if worst else None,
        "kept": [_row(e) for e in entries if e.get("status") == "keep" and e.get("iteration", 0) > 0],
        "rejected": [_row(e) for e in entries if e.get("status") in ("revert", "crash")],
        "iterations": max((e.get("iteration", 0) for e in entries), default=0),
        "review": [_row(e) for e in entries if e.get("review")],
        "compile_cache_dropped": [{"iteration": e.get("iteration"), "dropped": e["compile_cache_dropped"]}
                                  for e in entries if e.get("compile_cache_dropped")],
        # Rows whose children ran without a sandbox (``sandbox: none: <why>``); rows from before the
        # sandbox carry no field and are not listed.
        "unboxed": [{"iteration": e.get("iteration"), "why": str(e["sandbox"])[len("none: "):]}
                    for e in entries if str(e.get("sandbox") or "").startswith("none")],
        # Rows with timed calls no check could judge (child.checkrun.row_fields): said, never silent.
        "unchecked": [{"iteration": e.get("iteration"), "calls": e["unchecked"]} for e in entries if e.get("unchecked")],
    }


def _row(entry: dict) -> dict:
    """One iteration as the report lists it; every field present (None when not recorded)."""
    decision = entry.get("decision") or {}
    return {
        "iteration": entry.get("iteration"),
        "commit": (entry.get("commit") or "")[:12] or None,
        "optimization": entry.get("optimization", ""),
        "latency_ms": entry_latency(entry) if entry.get("status") != "crash" else None,
        "status": entry.get("status"),
        "tier": decision.get("tier"),
        "geomean_change": decision.get("geomean_change"),
        "reason": decision.get("reason") or entry.get("reason"),
        "crash_class": entry.get("crash_class"),
        "patch": entry.get("patch"),
    }


def render_report(entries: list[dict], session: dict, plot_path: str | None, *,
                  changed_thresholds: list[tuple[str, object, object]] = (),
                  edited_commands: list[tuple[str, str, str]] = ()) -> str:
    """``changed_thresholds`` (``Thresholds.changed()``) and ``edited_commands``
    (``Session.edited_commands()``) are named at the top: what the session loosened before its baseline."""
    summary = summarize_session(entries)
    env_source = summary["baseline"] or (entries[-1] if entries else {})
    return load_template("report.md.j2").render(
        s=summary,
        changed_thresholds=list(changed_thresholds),
        edited_commands=list(edited_commands),
        session=_flat_items(session or {}),
        environment=_flat_items(env_source.get("env") or {}),
        plot_path=plot_path,
    )


def _flat_items(data: dict) -> list[tuple[str, str]]:
    """``key: value`` pairs for a bullet list; nested dicts become ``a=1, b=2``."""
    items = []
    for key, value in data.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        items.append((str(key), markdown_cell(value)))
    return items


# --- plot -----------------------------------------------------------------------------------------


def plot_running_best(entries: list[dict], png_path: str | Path) -> Path:
    """PNG of every iteration's latency and the running best (the baseline in force after it)."""
    # Lazy: matplotlib costs ~0.5 s to import and only `report` draws. Figure + the Agg canvas
    # directly, so no GUI backend is ever selected and no global pyplot state is touched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 3.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    best_x, best_y = [], []
    for i, entry in enumerate(entries):
        ref = current_baseline(entries[: i + 1])
        if ref is not None and entry_latency(ref) is not None:
            best_x.append(entry.get("iteration", i))
            best_y.append(entry_latency(ref))
    if best_x:
        ax.step(best_x, best_y, where="post", color="tab:blue", label="running best")
    styles = {"keep": ("o", "tab:green"), "revert": ("x", "tab:red")}
    for status, (marker, color) in styles.items():
        points = [(e.get("iteration"), entry_latency(e)) for e in entries
                  if e.get("status") == status and entry_latency(e) is not None]
        if points:
            ax.scatter(*zip(*points), marker=marker, color=color, label=status, zorder=3)
    for number, entry in enumerate(e for e in entries if e.get("status") == "crash"):
        ax.axvline(entry.get("iteration", 0), color="grey", linestyle=":", label="crash" if number == 0 else None)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("latency ms (geomean of shape medians)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    with atomic.replacing(png_path, "wb") as fh:
        fig.savefig(fh, format="png")
    return png_path


# --- files ----------------------------------------------------------------------------------------
