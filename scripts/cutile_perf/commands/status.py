"""``cutile-perf status``: the table, the current baseline, the stop condition, what to try next."""
from __future__ import annotations

import html
from pathlib import Path
from types import SimpleNamespace

from cutile_perf.judge import rules
from cutile_perf.store import git_ops, jitcache
from cutile_perf.loop import offbranch, render
from cutile_perf.store.history import History
from cutile_perf.errors import Refused
from cutile_perf.loop.iteration_state import State, state_key
from cutile_perf.kernel import target_timing
from cutile_perf.skill import playbook
from cutile_perf.store import session as session_mod
from cutile_perf.output import Outcome

SHOWN_ROWS = 10


def _pending(session, g) -> State | None:
    """The interrupted iteration's state, or a stand-in naming why it cannot be read (status never refuses)."""
    try:
        return State.load(session, state_key(g))
    except (OSError, Refused) as exc:
        return SimpleNamespace(iteration="?", step=f"unreadable: {exc}")


def _timing(session, history: History) -> str:
    """How the perf tests time: re-read under the baseline's frozen environment when there is one
    (init may have run on another machine, with CUPTI or CUDAGRAPH set otherwise), else init's."""
    frozen = history.frozen_env()
    if frozen is not None:
        perf_file = target_timing.perf_test_file(session.test, session_mod.command_test_files(session.perf_cmd))
        found = target_timing.read(session.repo, perf_file, frozen)
        if found.method != "unknown":
            return f"{found.summary} (as the baseline ran); closest cutile_perf.bench mode: {found.closest_bench_mode}"
    summary = session.timing.get("summary")
    if not summary:
        return ""
    closest = session.timing.get("closest_bench_mode")
    return summary + (f"; closest cutile_perf.bench mode: {closest}" if closest else "")


def status(*, repo: Path, show_all: bool) -> Outcome:
    session = session_mod.load(repo)
    g = git_ops.open_repo(session.repo)
    history = History.open(session, g, strict=False)
    broken = history.broken
    entries = history.rows
    shown = entries if show_all else entries[-SHOWN_ROWS:]
    baseline = history.baseline()
    thresholds = session.thresholds
    pending_state = _pending(session, g)
    stop = history.stop() if entries else None
    hint = rules.next_priority_hint(entries) if entries else None
    bound = session.classification.get("bound", "memory-bound")
    tried = [e.get("optimization", "") for e in entries if e.get("iteration", 0) > 0]
    left = playbook.remaining(bound, tried)
    lock = session_mod.read_lock(session.repo)
    stale = lock is not None and session_mod.lock_is_stale(lock)
    pending = [p for p in git_ops.changed_paths(g) if not p.startswith("sandbox/")]
    off = offbranch.session_off_branch(session, g, history.kept_commit()) if baseline else None

    # The table's cells are HTML-escaped for markdown viewers; a terminal shows the text itself
    # (control characters are already stripped from every cell).
    lines = [html.unescape(render.render_perf_results(shown).rstrip())]
    if not show_all and len(entries) > SHOWN_ROWS:
        lines.append(f"({len(entries) - SHOWN_ROWS} earlier rows hidden; --all shows them)")
    if baseline:
        lines.append(f"current baseline: iteration {baseline.get('iteration')} "
                     f"{baseline.get('latency_ms', float('nan')):.6f} ms at {str(baseline.get('commit'))[:10]}")
    else:
        lines.append("no baseline yet: run `cutile-perf baseline`")
    lines += [f"changed before the baseline: {line}" for line in session.changes_from_init()]
    if timing := _timing(session, history):
        lines.append(f"timing of the perf tests: {timing}")
    changed, edited = thresholds.changed(), session.edited_commands()
    lines.append(f"stop: {stop}" if stop else "stop condition: none holds")
    if hint:
        lines.append(f"hint: {hint}")
    lines.append("next (playbook, not yet tried): " + (", ".join(f"{i.letter} {i.name}" for i in left[:4]) or "all tried"))
    boxed = (entries[-1].get("sandbox") if entries else None) or ""
    if boxed.startswith("none"):
        lines.append(f"warning: the last row's children ran without a sandbox ({boxed}); a hostile kernel could "
                     "reach the repository, the session and the interpreter (references/harness.md, Sandbox)")
    if broken:
        lines.append(f"LOG BROKEN: {broken}; try, baseline and resume refuse until it is restored")
    if off is not None:
        lines.append(f"KEPT COMMIT OFF THE BRANCH: {off.problem(g, session.branch)}; try refuses until you choose: "
                     f"{off.fix(g)}")
    if pending_state is not None:
        lines.append(f"interrupted: iteration {pending_state.iteration} stopped after '{pending_state.step}': "
                     "run `cutile-perf resume`")
    if stale:
        lines.append(f"warning: a killed `{lock.get('command')}` left its lock: run `cutile-perf resume`")
    if pending:
        lines.append(f"uncommitted changes: {', '.join(pending[:5])}")
    on_branch = git_ops.current_branch(g)
    if on_branch != session.branch:  # the table is the session's, not what this checkout holds
        lines.append(f"warning: on {on_branch or 'a detached HEAD'}, not the session's branch {session.branch} "
                     f"(`git switch {session.branch}` to go back to it)")
    cache = jitcache.state(jitcache.session_dir(session.sandbox)) if session.jit_cache else None
    if cache and (cache["unrecorded"] or cache["unreadable"]):
        what = ("is not a cuTile cache" if cache["unreadable"]
                else f"holds {cache['unrecorded']} kernel(s) no cutile-perf command compiled")
        lines.append(f"warning: the compile cache sandbox/{jitcache.CACHE_DIR}/ {what}: the next loop command drops them")
    data = {"rows": shown, "baseline": baseline, "stop": stop, "hint": hint,
            "next": [i.letter for i in left], "stale_lock": stale, "pending_changes": pending,
            "head": git_ops.head(g), "log_broken": broken, "branch": on_branch, "session_branch": session.branch,
            "kept_commit_off_branch": off.to_dict(g, session.branch) if off is not None else None,
            "interrupted_step": pending_state.step if pending_state else None,
            "compile_cache": cache, "sandbox": boxed or None, "timing": timing or None,
            "changed_thresholds": {n: {"value": v, "default": d} for n, v, d in changed},
            "edited_commands": {k: {"command": c, "init": d} for k, c, d in edited}}
    return Outcome("\n".join(lines), data, 1 if broken else 0)
