"""The guards: every refusal that comes before an iteration (or a baseline, verify, adopt) moves anything.

Each raises a ``CutilePerfError`` with what was found and what to run next; none changes the
repository, so a refused command leaves the user's work exactly as it was.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.child import envcheck
from cutile_perf.errors import EnvMissing, FenceViolation, NoChange, Refused
from cutile_perf.kernel import probes
from cutile_perf.loop import offbranch
from cutile_perf.loop.iteration_state import State
from cutile_perf.skill.install import is_installed_skill_path
from cutile_perf.store import git_ops, safe_read
from cutile_perf.store import session as session_mod
from cutile_perf.store.history import History
from cutile_perf.store.session import Session


def require_gpu(session: Session, probe: envcheck.Probe) -> None:
    """Refuse (EnvMissing, exit 3) before anything is touched when no usable GPU is found.

    Without a GPU the perf tests skip and every iteration would end as a ``no-record`` crash row.
    ``require_gpu: false`` in session.yaml turns the gate off (the CPU test suite's simulated repo).
    """
    if not session.require_gpu:
        return
    env = probe.result()
    if env.gpu is None:
        # nvidia-smi found nothing; torch may still see a GPU (a container without nvidia-smi).
        # Slow (imports torch), so only on this rare path.
        env = envcheck.check(with_torch=True)
    if env.gpu_problems:
        raise EnvMissing("no usable GPU: " + "; ".join(p.message for p in env.gpu_problems),
                         "nothing was changed; `cutile-perf env` shows what this machine has")


def require_session_branch(session: Session, g) -> None:
    """Refuse (exit 3) unless the session branch is checked out.

    Right after ``init`` the user's branch and the session branch are the same commit, so the HEAD
    check alone would let ``try`` commit onto ``main`` (or onto a detached HEAD, where the commit is
    lost at the next checkout), and ``resume`` reset ``main``'s own commits away.
    """
    branch = git_ops.current_branch(g)
    if branch != session.branch:
        where = "a detached HEAD" if branch is None else f"branch {branch}"
        raise Refused(f"the repository is on {where}, not the session branch {session.branch}",
                      f"git checkout {session.branch}, then run the command again")


def refuse_foreign_commits(session: Session, g, kept: str, head: str) -> None:
    """HEAD is not the last kept commit: refuse, naming what is there, never drop or adopt it silently.

    Commits made by hand on the session branch were never measured by the loop; turning them back
    into an uncommitted change lets ``try`` measure them like any other change.
    """
    if git_ops.is_ancestor(g, kept, head):
        shas = git_ops.commits_between(g, kept, head)
        shown = ", ".join(git_ops.short(g, s) for s in shas[:5])
        raise Refused(f"{len(shas)} commit(s) on {session.branch} after the last kept commit {git_ops.short(g, kept)} "
                      f"were not made by cutile-perf ({shown})",
                      f"to have them measured: git reset --soft {git_ops.short(g, kept)}, then cutile-perf try; "
                      "to keep them aside: git branch <name> HEAD first")
    off = offbranch.off_branch(g, kept, head)
    # The kept commit was amended, rebased or reset away: ``resume`` alone cannot choose between the
    # user's commit and the measured one, so the refusal names the flag of each way on.
    raise Refused(off.problem(g, session.branch), off.fix(g))


def require_nothing_pending(session: Session, g) -> None:
    """The guards before the log is opened: the session branch is checked out and no interrupted
    iteration waits for ``resume``."""
    require_session_branch(session, g)
    require_no_interrupted(session)


def require_no_interrupted(session: Session) -> None:
    """Refuse (exit 3) while an interrupted iteration waits for ``resume``: the log's last row may
    be that iteration's own, unanchored, and its commit not settled yet (``try``, ``verify``)."""
    if State.exists(session):
        raise Refused("an interrupted iteration is not settled yet", "run `cutile-perf resume`")


def require_settled(session: Session, g, history: History) -> str:
    """The guards on the history every change runs behind (after ``require_nothing_pending``): a
    baseline exists, the measurement environment is the baseline's, and HEAD is the last kept
    commit. Returns that commit."""
    require_baseline(history)
    kept = history.kept_commit()
    head = git_ops.head(g)
    if head != kept:
        refuse_foreign_commits(session, g, kept, head)
    return kept


def require_baseline(history: History) -> None:
    """Refuse (exit 3) before a baseline is recorded, or under another measurement environment than
    the baseline's (``require_baseline_env``): what ``try`` and ``verify`` measure against."""
    if history.baseline() is None:
        raise Refused("no baseline recorded yet", "run `cutile-perf baseline` first")
    require_baseline_env(history)


def require_baseline_env(history: History) -> None:
    """Refuse (exit 3) to measure under other timing, autotune, compiler or import switches than the
    baseline ran under (``knobs.MEASUREMENT_ENV_NAMES``): the records would move with no change to
    the kernel."""
    changed = history.env_changes(knobs.measurement_env())
    if changed:
        raise Refused("the environment that shapes measurements differs from the baseline's: " + "; ".join(changed),
                      "set it as it was at the baseline (the log's first row, frozen_env), or start a new session")


def fenced_changes(session: Session, changed: list[str]) -> list[str]:
    """The changed paths an iteration owns: inside the fence, sandbox excluded."""
    return [p for p in changed if session.fenced(p)]


def paths_touched(session: Session, g, base: str) -> list[str]:
    """Fenced paths that differ from ``base`` in HEAD or in the work tree."""
    committed = git_ops.changed_between(g, base, "HEAD") if git_ops.head(g) != base else []
    return sorted({*fenced_changes(session, committed), *fenced_changes(session, git_ops.changed_paths(g))})


def bytecode_cache(path: str) -> bool:
    """Untracked files no stage can ever see: bytecode caches never enter a pristine checkout."""
    return "__pycache__/" in path or path.endswith((".pyc", ".pyo"))


def unfenced_since_base(session: Session, g, commit: str) -> list[str]:
    """Paths outside the fence that ``commit`` changes since the session's base: the loop's checkouts
    take those from the base, so no measurement of ``commit`` would include them."""
    return [p for p in git_ops.changed_between(g, session.base_commit, commit) if not session.in_fence(p)]


def probe_scan(g, base: str, files: dict[str, Path]) -> tuple[str | None, list]:
    """Scan ``files`` ({repo path: the file to read}) against ``base``'s copies (``kernel.probes``):
    (why a file is too large to scan, or None; the findings). Non-Python paths are not scanned."""
    old, new = {}, {}
    for rel, target in files.items():
        if not rel.endswith(".py"):
            continue
        why = probes.too_large(rel, target.stat().st_size)
        if why:
            return why, []
        new[rel] = safe_read.read_text(target, probes.MAX_SOURCE_BYTES)
        sha = git_ops.blob_sha_at(g, base, rel)
        previous = git_ops.blob_bytes(g, sha) if sha else None
        # The base's copy, scanned only within the same bound (a bigger one was never scanned either).
        old[rel] = previous.decode("utf-8", errors="replace") \
            if previous is not None and len(previous) <= probes.MAX_SOURCE_BYTES else None
    return None, probes.scan(old, new)


def refuse_probes(g, base: str, paths: list[str]) -> None:
    """Refuse (exit 3, nothing touched) a change that adds measurement-context probes or patches the
    clocks and statistics that time it (``kernel.probes``): perf-only behaviour is stopped before it
    runs, and the change stays in the work tree for the user to see."""
    root = git_ops.root(g)
    too_large, findings = probe_scan(g, base, {rel: root / rel for rel in paths if (root / rel).is_file()})
    if too_large:
        raise Refused(too_large, "split it into smaller modules (the change is untouched)")
    if findings:
        raise Refused(probes.describe(findings), "a kernel that asks whether it is being measured, or patches what "
                      "measures it, is never tried; remove those lines (the change is untouched)")


def candidate_paths(session: Session, g) -> list[str]:
    """The fenced paths this iteration changes, or the refusal that says why it cannot run."""
    changed = [p for p in git_ops.changed_paths(g) if not bytecode_cache(p)
               and not is_installed_skill_path(p)]
    outside = [p for p in changed if not session.in_fence(p)]
    if outside:
        shown = ", ".join(outside[:5]) + (" ..." if len(outside) > 5 else "")
        raise FenceViolation(f"changes outside the fence: {shown}; fence: {', '.join(session.fence)}",
                             "undo them yourself (cutile-perf never touches them), or fence them at init with --allow")
    paths = fenced_changes(session, changed)
    if not paths:
        raise NoChange(f"no change to the fenced files ({', '.join(session.fence)})", "edit the kernel, then run try again")
    root = git_ops.root(g)
    for rel in paths:
        target = root / rel
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise Refused(f"{rel} is not a regular file (a symlink or a folder): the commit would not hold the "
                          "code that runs", "replace it with the file's content")
    filtered = git_ops.filtered_paths(g, paths)
    if filtered:
        raise Refused(f"git attributes (a clean filter, ident or eol conversion) would commit other bytes than the "
                      f"work tree holds for {', '.join(filtered)}", "remove the attribute for the fenced files")
    return paths


@contextmanager
def measuring(repo: Path, command: str) -> Iterator[tuple[Session, object, History]]:
    """(session, repository handle, history) for a command that measures kept commits beside the
    loop (``verify``, ``screen``): refused without a GPU, then held under the session lock with no
    interrupted iteration and a baseline recorded, in that order, before anything is measured."""
    session = session_mod.load(repo)
    require_gpu(session, envcheck.Probe())
    with session_mod.locked(session.repo, command):
        g = git_ops.open_repo(session.repo)
        require_no_interrupted(session)
        history = History.open(session, g)
        require_baseline(history)
        yield session, g, history
