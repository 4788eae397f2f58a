"""``cutile-perf init``: branch, locate kernel and test, classify, check the environment, write the session."""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

from cutile_perf.store import atomic, git_ops
from cutile_perf.child import envcheck, selection
from cutile_perf.kernel import kernel_scan
from cutile_perf.skill import playbook
from cutile_perf.store import session as session_mod
from cutile_perf.output import Outcome, say
from cutile_perf.judge.rules import Thresholds
from cutile_perf.errors import DirtyTree, Refused, UsageError
from cutile_perf.store import log
from cutile_perf.loop import render


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
         timeout_s: float, perf_test: Path | None = None, correctness_jobs: int = 1,
         prestart_perf: bool = False) -> Outcome:
    timeout_s = session_mod.parse_timeout(timeout_s)  # nan would pass "<= 0" and disable the hang guard
    if not 1 <= correctness_jobs <= session_mod.MAX_CORRECTNESS_JOBS:
        raise UsageError(f"--correctness-jobs must be from 1 to {session_mod.MAX_CORRECTNESS_JOBS}, "
                         f"not {correctness_jobs}")
    g = git_ops.open_repo(repo)
    root = git_ops.root(g).resolve()
    if not git_ops.has_commits(g):
        raise UsageError(f"{root} has no commits yet", "commit the kernel and its tests first: the session branches "
                         "from a commit and reverts to it")
    if branch is not None and (reason := git_ops.branch_name_error(g, branch)):
        raise UsageError(f"--branch {branch!r}: {reason}", "pick a name like cutile-perf-rms-norm")
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
    # A perf test kept in its own file (scaffold-perf writes test_<op>_perf.py) is named literally in
    # the perf command; the correctness command keeps the {test} placeholder.
    perf_file = _perf_file(root, perf_test) if perf_test is not None else kernel_scan.sibling_perf_test(test_file)
    perf_cmd = selection.perf_command(perf_file.resolve().relative_to(root).as_posix() if perf_file else None)

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", kernel_files[0].stem)
    branch = branch or f"cutile-perf-{stem}-{_dt.date.today():%Y%m%d}"
    if reason := git_ops.branch_name_error(g, branch):  # a kernel file named "x..y.py" gives a bad default
        raise UsageError(f"branch name {branch!r}: {reason}", "pass --branch <name>")
    if git_ops.branch_exists(g, branch):
        # Refuse rather than add a suffix: an existing branch may hold an earlier session's kept commits.
        raise Refused(f"branch {branch} already exists", "pass --branch <new name>, or check it out and continue there")

    fence = sorted({f.relative_to(root).as_posix() for f in kernel_files} | {_fence_entry(root, a) for a in allow})
    session = session_mod.Session(
        repo=root, kernel=kernel_files[0].stem, kernel_files=tuple(f.relative_to(root).as_posix() for f in kernel_files),
        fence=tuple(fence), test=test_file.resolve().relative_to(root).as_posix(),
        correctness_cmd=session_mod.CORRECTNESS_TEMPLATE, perf_cmd=perf_cmd,
        thresholds=Thresholds(), timeout_s=timeout_s, base_commit=git_ops.head(g), branch=branch,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        classification={"kernel_type": scan.kernel_type, "ai_estimate": scan.ai_estimate, "bound": scan.bound},
        correctness_jobs=correctness_jobs, prestart_perf=prestart_perf,
    )
    # Before anything is created: an empty selection would pass init and fail only at the baseline.
    selections = check_selections(session, timeout_s=min(float(timeout_s), selection.COLLECT_TIMEOUT_S))
    env = envcheck.check()
    git_ops.exclude_locally(g, f"/{session_mod.SANDBOX}/")
    git_ops.create_branch(g, branch)
    session_mod.save(session)

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
        *(_selection_line(sel) for sel in selections),
        f"playbook priority ({scan.bound}): {playbook.render_priority(scan.bound)}",
        "environment:",
        *("  " + line for line in envcheck.render(env).splitlines()),
        "next: cutile-perf baseline",
    ])
    data = {"branch": branch, "base_commit": session.base_commit, "kernel_files": list(session.kernel_files),
            "fence": fence, "test": session.test, "other_tests": [p.relative_to(root).as_posix() for p in other_tests],
            "scan": scan.to_dict(), "selections": {sel.which: sel.to_dict() for sel in selections},
            "playbook": [i.letter for i in playbook.priority(scan.bound)],
            "environment": {**env.record(), "problems": [p.message for p in env.problems]},
            "session": str(session.sandbox / session_mod.SESSION_FILE)}
    return Outcome(text, data)


def _perf_file(root: Path, raw: Path) -> Path:
    path = (raw if raw.is_absolute() else root / raw).resolve()
    if not path.is_file():
        raise UsageError(f"--perf-test {raw} does not exist")
    if not path.is_relative_to(root):
        raise UsageError(f"--perf-test {raw}: outside the repository {root}")
    return path


def _selection_line(sel: selection.Selection) -> str:
    if sel.error:
        return (f"{sel.which} tests: not checked, collection failed here ({sel.error}); "
                "baseline will tell on the GPU machine")
    return f"{sel.which} tests: {sel.count} selected (e.g. {sel.node_ids[0]})"


def check_selections(session: session_mod.Session, *, timeout_s: float) -> list[selection.Selection]:
    """Collect the correctness and perf selections; Refused when either selects nothing.

    A collection that fails outright (the test module needs a GPU or a package this machine lacks
    at import) is not a refusal: setting up on a CPU machine and measuring elsewhere is allowed,
    and the line printed says the selection was not checked.
    """
    env = selection.import_env(session)
    found = [selection.collect(which, session.argv(which), cwd=session.repo, timeout_s=timeout_s, env=env)
             for which in ("correctness", "perf")]
    by_name = {sel.which: sel for sel in found}
    if by_name["perf"].empty:
        raise Refused(f"the perf command selects no test in {session.test} ({session.perf_cmd})",
                      f"write a perf test with `cutile-perf scaffold-perf --kernel {session.kernel_files[0]}`, "
                      "review and commit it, then re-run init (or pass --test <file with a test_perf>)")
    if by_name["correctness"].empty:
        raise Refused(f"the correctness command selects no test in {session.test} ({session.correctness_cmd})",
                      "the test file needs test_* functions with a 'cutile' backend parameter; "
                      "pass --test <file> to use another")
    return found
