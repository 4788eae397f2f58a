"""``cutile-perf init``: branch, locate kernel and test, classify, check the environment, write the session."""
from __future__ import annotations

import datetime as _dt
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cutile_perf.store import atomic, git_ops
from cutile_perf.child import box, bytecode, envcheck, measure, selection, warmstart
from cutile_perf import knobs
from cutile_perf.kernel import kernel_scan, survey, target_timing
from cutile_perf.skill import playbook
from cutile_perf.store import session as session_mod
from cutile_perf.output import Outcome, say
from cutile_perf.judge.rules import Thresholds
from cutile_perf.errors import CouldNotWrite, DirtyTree, Refused, UsageError
from cutile_perf.store.history import History
from cutile_perf.loop import render


def _fence_entry(repo: Path, raw: str, test_files: tuple[str, ...]) -> str:
    """A repo-relative fence entry; directories end with "/" so they fence everything under them.

    A UsageError for what the loop may never change (``session.protected_reason``): a test, a
    conftest or pytest/packaging configuration, anything under tests/, the session's test files,
    sandbox/, .git/, a folder holding any of these, and a glob (it could take any of them in)."""
    if not raw.strip():
        raise UsageError("--allow: empty path")
    if set(raw) & set("*?["):
        raise UsageError(f"--allow {raw}: a glob is not a fence entry", "name the files, or a folder")
    path = Path(raw)
    absolute = (path if path.is_absolute() else repo / path).resolve()
    if not absolute.is_relative_to(repo):
        raise UsageError(f"--allow {raw}: outside the repository {repo}")
    rel = absolute.relative_to(repo).as_posix()
    if rel in {".", ""} or rel == session_mod.SANDBOX or rel.startswith(".git"):
        raise UsageError(f"--allow {raw}: cannot fence the whole repository, .git or sandbox/")
    entry = rel + "/" if absolute.is_dir() else rel
    if bad := session_mod.check_fence(repo, [entry], test_files):
        raise UsageError(f"--allow {raw}: {bad[0]} {bad[1]}; the loop may not change tests or their configuration",
                         "fence only kernel code")
    if not absolute.exists():  # a typo fences nothing, and the agent's edit of the file it meant is reverted
        raise UsageError(f"--allow {raw}: no such file or folder in {repo}",
                         "check the path; write and commit a new helper file before init")
    return entry


def init(*, repo: Path, kernel: str, test: Path | None, branch: str | None, allow: list[str],
         timeout_s: float, perf_test: Path | None = None, correctness_jobs: int = 1,
         prestart_perf: bool = True, sandbox_mode: str = "auto") -> Outcome:
    timeout_s = _checked_arguments(kernel, timeout_s, correctness_jobs, sandbox_mode)
    g = git_ops.open_repo(repo)
    root = git_ops.root(g).resolve()
    _require_startable(g, root, branch)
    kernel_files = _kernel_files(root, kernel)
    test_file, other_tests = _test_file(root, test, kernel_files[0])
    scan = kernel_scan.scan_file(kernel_files[0], root)
    # A perf test kept in its own file (scaffold-perf writes test_<op>_perf.py) is named literally in
    # the perf command; the correctness command keeps the {test} placeholder.
    perf_file = _perf_file(root, perf_test) if perf_test is not None else kernel_scan.sibling_perf_test(test_file)
    perf_cmd = selection.perf_command(perf_file.resolve().relative_to(root).as_posix() if perf_file else None)
    branch = _new_branch(g, branch, kernel_files[0])
    test_files = (test_file.resolve().relative_to(root).as_posix(), *session_mod.command_test_files(perf_cmd))
    # How the perf tests time (read from their source, never run): the judge measures that way.
    timing = target_timing.read(root, target_timing.perf_test_file(test_files[0], list(test_files[1:])),
                                knobs.measurement_env())
    kernel_rels = [f.relative_to(root).as_posix() for f in kernel_files]
    if bad := session_mod.check_fence(root, kernel_rels, test_files):
        raise UsageError(f"--kernel {kernel}: {bad[0]} {bad[1]}; the kernel cannot be a test or its configuration")
    fence = sorted(set(kernel_rels) | {_fence_entry(root, a, test_files) for a in allow})
    session = session_mod.Session(
        repo=root, kernel=kernel_files[0].stem, kernel_files=tuple(f.relative_to(root).as_posix() for f in kernel_files),
        fence=tuple(fence), test=test_file.resolve().relative_to(root).as_posix(),
        correctness_cmd=session_mod.CORRECTNESS_TEMPLATE, perf_cmd=perf_cmd,
        thresholds=Thresholds(), timeout_s=timeout_s, base_commit=git_ops.head(g), branch=branch,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        classification={"kernel_type": scan.kernel_type, "ai_estimate": scan.ai_estimate, "bound": scan.bound},
        correctness_jobs=correctness_jobs, prestart_perf=prestart_perf, sandbox_mode=sandbox_mode,
        timing=timing.to_dict(),
    )
    selections, env = _collect_and_probe(session, timeout_s)  # before anything is created
    git_ops.exclude_locally(g, f"/{session_mod.SANDBOX}/")
    _start_session(session, g)
    if not env.can_measure:
        say("warning: this machine cannot measure yet (see the environment check); set up here, measure on a GPU")
    # Said here, before anything is measured, and again on every row (``sandbox``): never a silent fallback.
    unboxed = box.decide(session.sandbox_mode)
    isolation = box.label(unboxed)

    uncovered = uncovered_line(selections)
    text = "\n".join([
        f"session ready on branch {session.branch} (base {git_ops.short(g, session.base_commit)})",
        kernel_scan.render(scan),
        f"test file: {session.test}" + (
            f" (its folders mirror the kernel's path; also found: "
            f"{', '.join(p.relative_to(root).as_posix() for p in other_tests)}; --test picks another)"
            if other_tests else ""),
        f"fence (files you may change): {', '.join(fence)}",
        *_selection_lines(selections),
        *([uncovered[0]] if uncovered[0] else []),
        timing_line(timing),
        checked_line(timing, session.kernel_files[0] if session.kernel_files else kernel),
        f"playbook priority ({scan.bound}): {playbook.render_priority(scan.bound)}",
        ("test children: each in a sandbox (unshare)" if unboxed is None else
         f"warning: test children will run WITHOUT a sandbox ({unboxed}); a hostile kernel could reach the "
         "repository, the session and the interpreter, and verify is not independent"),
        "environment:",
        *("  " + line for line in envcheck.render(env).splitlines()),
        "next: cutile-perf baseline",
    ])
    data = {"branch": branch, "base_commit": session.base_commit, "kernel_files": list(session.kernel_files),
            "fence": fence, "test": session.test, "other_tests": [p.relative_to(root).as_posix() for p in other_tests],
            "scan": scan.to_dict(), "selections": {sel.which: sel.to_dict() for sel in selections},
            "playbook": [i.letter for i in playbook.priority(scan.bound)],
            "environment": {**env.record(), "problems": [p.message for p in env.problems]},
            "session": str(session.sandbox / session_mod.SESSION_FILE), "sandbox": isolation,
            "timing": timing.to_dict(), "uncovered_perf_cases": uncovered[1]}
    return Outcome(text, data)


def _checked_arguments(kernel: str, timeout_s: float, correctness_jobs: int, sandbox_mode: str) -> float:
    """The timeout as a number, after the arguments that need no repository are checked."""
    timeout_s = session_mod.parse_timeout(timeout_s)  # nan would pass "<= 0" and disable the hang guard
    if sandbox_mode not in session_mod.SANDBOX_MODES:
        raise UsageError(f"sandbox mode {sandbox_mode!r}: choose one of {', '.join(session_mod.SANDBOX_MODES)}")
    if not kernel.strip():
        raise UsageError("--kernel: empty", "pass a name like rms_norm or a path to the kernel file")
    session_mod.parse_correctness_jobs(correctness_jobs)
    return timeout_s


def _require_startable(g, root: Path, branch: str | None) -> None:
    """Refuse a repository a session cannot start in: no commit, a bad --branch, a session already
    there, or uncommitted changes to tracked files."""
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


def _kernel_files(root: Path, kernel: str) -> list[Path]:
    """The kernel's files, each inside the repository and none a test or its configuration."""
    kernel_files = kernel_scan.find_kernel_files(root, kernel)
    for found in kernel_files:
        if not found.resolve().is_relative_to(root):
            raise UsageError(f"--kernel {kernel}: {found} is outside the repository {root}")
        if why := session_mod.protected_reason(found.relative_to(root).as_posix()):
            raise UsageError(f"--kernel {kernel}: {found.relative_to(root).as_posix()} {why}; "
                             "the kernel cannot be a test or its configuration")
    return kernel_files


def _test_file(root: Path, test: Path | None, kernel_file: Path) -> tuple[Path, list[Path]]:
    """(the correctness test file: --test, else the one chosen for the kernel; the other candidates)."""
    test_file = (test if test is None or test.is_absolute() else root / test)
    other_tests: list[Path] = []
    if test_file is None:
        test_file, other_tests = kernel_scan.choose_test_file(root, kernel_file)
    elif not test_file.is_file():
        raise UsageError(f"test file {test} does not exist")
    if not test_file.resolve().is_relative_to(root):
        raise UsageError(f"--test {test}: outside the repository {root}")
    return test_file, other_tests


def _new_branch(g, branch: str | None, kernel_file: Path) -> str:
    """The session branch: --branch, else one named after the kernel and today; it must not exist yet."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", kernel_file.stem)
    branch = branch or f"cutile-perf-{stem}-{_dt.date.today():%Y%m%d}"
    if reason := git_ops.branch_name_error(g, branch):  # a kernel file named "x..y.py" gives a bad default
        raise UsageError(f"branch name {branch!r}: {reason}", "pass --branch <name>")
    if git_ops.branch_exists(g, branch):
        # Refuse rather than add a suffix: an existing branch may hold an earlier session's kept commits.
        raise Refused(f"branch {branch} already exists", "pass --branch <new name>, or check it out and continue there")
    return branch


def _collect_and_probe(session: session_mod.Session, timeout_s: float):
    """(the selections' collections, the environment check), both before anything is created: an
    empty selection would pass init and fail only at the baseline. The environment check (its torch
    import is seconds on a GPU host) runs while the collections do, and so does the installed-code
    bytecode the boxed children will read (child/bytecode.py), which the baseline would otherwise
    compile before its first child."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        probed = pool.submit(envcheck.check)
        if measure.box_why_not(session) is None:
            pool.submit(bytecode.prepare, warmstart.WARM_MODULES)
        selections = check_selections(session, timeout_s=min(float(timeout_s), selection.COLLECT_TIMEOUT_S))
        return selections, probed.result()


def _start_session(session: session_mod.Session, g) -> None:
    """Write the session's files, then create its branch. Files first: a sandbox/ that cannot be
    written (full, read-only, a file in its place) then stops init with nothing to undo in git, and
    what was made is removed."""
    made_sandbox = not session.sandbox.exists()
    try:
        session_mod.save(session)
        atomic.write_text(session.results_path, render.render_perf_results(History.open(session, g).rows))
        git_ops.create_branch(g, session.branch)
    except BaseException as exc:
        _remove_session_files(session, made_sandbox)
        if isinstance(exc, OSError):
            where = exc.filename or session.sandbox
            raise CouldNotWrite(f"init could not write {where}: {exc.strerror or exc}",
                                "make sandbox/ writable (and the disk not full), then re-run init") from exc
        raise


def _remove_session_files(session: session_mod.Session, made_sandbox: bool) -> None:
    """Undo a failed init's writes: sandbox/ when init made it, else only the files init writes."""
    if made_sandbox:
        shutil.rmtree(session.sandbox, ignore_errors=True)
        return
    for path in (session.sandbox / session_mod.SESSION_FILE, session.results_path):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass  # best effort: the error being reported is the one that matters


def _perf_file(root: Path, raw: Path) -> Path:
    path = (raw if raw.is_absolute() else root / raw).resolve()
    if not path.is_file():
        raise UsageError(f"--perf-test {raw} does not exist")
    if not path.is_relative_to(root):
        raise UsageError(f"--perf-test {raw}: outside the repository {root}")
    return path


def timing_line(timing: target_timing.Timing) -> str:
    """How the perf tests time, and the cutile_perf.bench mode that times alike (one line)."""
    if timing.method == "unknown":
        return f"timing of the perf tests: {timing.summary}"
    overridden = [n for n in timing.notes if "has no effect" in n]
    return (f"timing of the perf tests ({', '.join(timing.sources[1:]) or timing.sources[0]}): {timing.summary}"
            + (f"; {overridden[0]}" if overridden else "")
            + f"; closest cutile_perf.bench mode: {timing.closest_bench_mode}")


def checked_line(timing: target_timing.Timing, kernel: str) -> str:
    """Whether the perf test compares its timed calls with a reference, and how to get one that does."""
    if timing.checked:
        return "perf test: checked (the first and last timed calls are compared with the reference on fresh inputs)"
    # The harness checks them (child/checked.py) unless CUTILE_PERF_UNCHECKED is set.
    return ("perf test: it does not check its timed calls itself; each perf run's are checked by the harness "
            "(a sampled timed call and a call after the timer, against the base commit's kernel on the same inputs; "
            "a call it cannot check, such as a backward pass, is named on the row); a test that checks by itself: "
            f"`cutile-perf scaffold-perf --kernel {kernel} --checked`")


def _selection_lines(selections: list[selection.Selection]) -> list[str]:
    """One line per selection, or one line in all when the tests need CUDA to collect here."""
    if no_cuda := next((sel.needs_cuda for sel in selections if sel.needs_cuda), ""):
        return [survey.no_cuda_line(no_cuda, after_init=True)]
    return [_selection_line(sel) for sel in selections]


def uncovered_line(selections: list[selection.Selection]) -> tuple[str, list[str]]:
    """Which perf cases no correctness test covers (``checkrun.uncovered_perf_cases``: best effort,
    by the integers of the test ids' parameters); their timed calls are what checks them."""
    from cutile_perf.child.checkrun import uncovered_perf_cases  # noqa: PLC0415

    by_name = {sel.which: sel for sel in selections}
    if any(sel.error or sel.needs_cuda for sel in selections) or set(by_name) != {"correctness", "perf"}:
        return "", []
    uncovered = uncovered_perf_cases(by_name["correctness"].node_ids, by_name["perf"].node_ids)
    if not uncovered:
        return "perf shapes: every perf case's sizes appear in a correctness test (by test-id parameters)", []
    return (f"perf shapes no correctness test covers (by test-id parameters, best effort): {len(uncovered)} of "
            f"{by_name['perf'].count} (e.g. {uncovered[0]}); checked timed calls check them at those sizes", uncovered)


def _selection_line(sel: selection.Selection) -> str:
    if sel.missing_module:
        return (f"{sel.which} tests: not checked, `{sel.missing_module}` is not importable here ({sel.error}); "
                f"{selection.install_hint(sel.missing_module)}")
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
    # The two collections are two children at once: each is seconds of interpreter, torch and test
    # imports on a GPU host (docs/results/2026-12-02-h200-speed.md, section 1), and neither needs
    # the other's answer.
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending = {which: pool.submit(selection.collect, which, session.argv(which), cwd=session.repo,
                                      timeout_s=timeout_s, env=env) for which in ("correctness", "perf")}
        found = [pending["correctness"].result(), pending["perf"].result()]
    if found[0].needs_cuda:  # one message for both: the same conftest stopped the perf collection
        found[1] = found[0].not_collected("perf")
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
