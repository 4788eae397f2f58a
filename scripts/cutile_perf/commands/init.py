"""``cutile-perf init``: branch, locate kernel and test, classify, check the environment, write the session."""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

from cutile_perf import atomic, envcheck, git_ops, kernel_scan, playbook
from cutile_perf import session as session_mod
from cutile_perf.commands import Outcome, say
from cutile_perf.decide import Thresholds
from cutile_perf.errors import DirtyTree, Refused, UsageError


def _fence_entry(repo: Path, raw: str) -> str:
    """A repo-relative fence entry; directories end with "/" so they fence everything under them."""
    path = Path(raw)
    absolute = (path if path.is_absolute() else repo / path).resolve()
    if not absolute.is_relative_to(repo):
        raise UsageError(f"--allow {raw}: outside the repository {repo}")
    rel = absolute.relative_to(repo).as_posix()
    if rel in {".", ""} or rel == session_mod.SANDBOX or rel.startswith(".git"):
        raise UsageError(f"--allow {raw}: cannot fence the whole repository, .git or sandbox/")
    return rel + "/" if absolute.is_dir() else rel


def init(*, repo: Path, kernel: str, test: Path | None, branch: str | None, allow: list[str],
         timeout_s: float) -> Outcome:
    if timeout_s <= 0:
        raise UsageError("--timeout must be a positive number of seconds")
    g = git_ops.open_repo(repo)
    root = git_ops.root(g).resolve()
    if (session_mod.sandbox(root) / session_mod.SESSION_FILE).exists():
        raise Refused(f"a session already exists in {root}/sandbox/session.yaml",
                      "continue it (cutile-perf status), or move sandbox/ away to start over")
    dirty = git_ops.tracked_changes(g)
    if dirty:
        # Never stash or reset: the user's uncommitted work is theirs.
        shown = ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise DirtyTree(f"uncommitted changes to tracked files: {shown}", "commit or stash them yourself, then re-run init")

    kernel_files = kernel_scan.find_kernel_files(root, kernel)
    test_file = (test if test is None or test.is_absolute() else root / test)
    other_tests: list[Path] = []
    if test_file is None:
        test_file, other_tests = kernel_scan.choose_test_file(root, kernel_files[0])
    elif not test_file.is_file():
        raise UsageError(f"test file {test} does not exist")
    scan = kernel_scan.scan_file(kernel_files[0], root)

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", kernel_files[0].stem)
    branch = branch or f"cutile-perf-{stem}-{_dt.date.today():%Y%m%d}"
    if git_ops.branch_exists(g, branch):
        # Refuse rather than add a suffix: an existing branch may hold an earlier session's kept commits.
        raise Refused(f"branch {branch} already exists", "pass --branch <new name>, or check it out and continue there")

    fence = sorted({f.relative_to(root).as_posix() for f in kernel_files} | {_fence_entry(root, a) for a in allow})
    env = envcheck.check()
    git_ops.exclude_locally(g, f"/{session_mod.SANDBOX}/")
    git_ops.create_branch(g, branch)
    session = session_mod.Session(
        repo=root, kernel=kernel_files[0].stem, kernel_files=tuple(f.relative_to(root).as_posix() for f in kernel_files),
        fence=tuple(fence), test=test_file.resolve().relative_to(root).as_posix(),
        correctness_cmd=session_mod.CORRECTNESS_TEMPLATE, perf_cmd=session_mod.PERF_TEMPLATE,
        thresholds=Thresholds(), timeout_s=session_mod.parse_timeout(timeout_s), base_commit=git_ops.head(g), branch=branch,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        classification={"kernel_type": scan.kernel_type, "ai_estimate": scan.ai_estimate, "bound": scan.bound},
    )
    session_mod.save(session)
    from cutile_perf import log, render

    atomic.write_text(session.results_path, render.render_perf_results(log.read_entries(session.log_path)))
    if not env.can_measure:
        say("warning: this machine cannot measure yet (see the environment check); set up here, measure on a GPU")

    text = "\n".join([
        f"session ready on branch {branch} (base {git_ops.short(g, session.base_commit)})",
        kernel_scan.render(scan),
        f"test file: {session.test}" + (
            f" (its folders mirror the kernel's path; also found: "
            f"{', '.join(p.relative_to(root).as_posix() for p in other_tests)}; --test picks another)"
            if other_tests else ""),
        f"fence (files you may change): {', '.join(fence)}",
        f"playbook priority ({scan.bound}): {playbook.render_priority(scan.bound)}",
        "environment:",
        *("  " + line for line in envcheck.render(env).splitlines()),
        "next: cutile-perf baseline",
    ])
    data = {"branch": branch, "base_commit": session.base_commit, "kernel_files": list(session.kernel_files),
            "fence": fence, "test": session.test, "other_tests": [p.relative_to(root).as_posix() for p in other_tests],
            "scan": scan.to_dict(),
            "playbook": [i.letter for i in playbook.priority(scan.bound)],
            "environment": {**env.record(), "problems": [p.message for p in env.problems]},
            "session": str(session.sandbox / session_mod.SESSION_FILE)}
    return Outcome(text, data)
