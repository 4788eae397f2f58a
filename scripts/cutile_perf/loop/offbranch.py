"""The one answer to "is the log's last kept commit still on the session branch?".

A user (or an agent) can amend the kept commit, rebase or squash the session branch, or reset it
back: the log's kept commit then has another sha, or none, on the branch. ``off_branch`` recognises
that state and, when it can, the branch's commit that holds the same change (same tree, or the same
patch after a rebase). ``try`` and ``resume`` refuse with the two ways on it names, ``status`` shows
it, and ``verify`` refuses to measure a kept commit the branch no longer holds. The ways on are
``resume``'s flags (``loop.adopt``): adopt the branch's head after re-measuring it, or move the
branch back to the kept commit with the user's commit kept on a backup branch.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cutile_perf.errors import Refused
from cutile_perf.store import git_ops, git_rewrites

ADOPT_FLAG = "--adopt"
RESET_FLAG = "--reset-to-kept"
BACKUP_PREFIX = "cutile-perf/rewritten-"
# How far back the branch is searched for the kept commit's change: a rebase onto a busy main
# brings many commits along, and each costs a patch id; past this, the change is not named.
SEARCH_LIMIT = 500


@dataclass(frozen=True)
class OffBranch:
    """The log's last kept commit ``kept`` is not ``head`` nor an ancestor of it."""

    kept: str
    head: str
    behind: bool  # ``head`` is an ancestor of ``kept``: the branch was moved back (git reset)
    twin: str | None = None  # the branch's commit holding the kept commit's change, when one does
    how: str | None = None  # "same tree" or "same patch": how ``twin`` was recognised

    def problem(self, g, branch: str) -> str:
        """One sentence: what happened to the kept commit, in plain words."""
        kept, head = git_ops.short(g, self.kept), git_ops.short(g, self.head)
        if self.behind:
            what = f"branch {branch} was moved back to {head}, behind it"
        elif self.twin is not None:
            what = (f"it was rewritten (amended or rebased) as {git_ops.short(g, self.twin)}, which holds the "
                    f"{'same files' if self.how == 'same tree' else 'same change'}; HEAD is {head}")
        else:
            what = f"it was amended, rebased or reset away; HEAD {head} does not hold its change"
        return f"the last kept commit {kept} is no longer on branch {branch}: {what}"

    def fix(self, g) -> str:
        """Both ways on, as the flags that take them."""
        head, kept = git_ops.short(g, self.head), git_ops.short(g, self.kept)
        back = (f"moves the branch forward to {kept} again, {head} staying in its history" if self.behind
                else f"moves the branch back to {kept} and keeps {head} on branch {backup_name(g, self.head)}")
        return (f"`cutile-perf resume {ADOPT_FLAG}` re-measures {head} like the baseline and records it as the new "
                f"reference; `cutile-perf resume {RESET_FLAG}` {back}")

    def to_dict(self, g, branch: str) -> dict:
        return {"kept": self.kept, "head": self.head, "behind": self.behind, "rewritten_as": self.twin,
                "recognised_by": self.how, "problem": self.problem(g, branch), "fix": self.fix(g),
                "flags": [ADOPT_FLAG, RESET_FLAG]}


def off_branch(g, kept: str, head: str) -> OffBranch | None:
    """None when ``head`` is ``kept`` or descends from it (the loop's own state, or commits made by
    hand on top, which ``guards.refuse_foreign_commits`` names); else what became of ``kept``."""
    if head == kept or git_ops.is_ancestor(g, kept, head):
        return None
    if git_ops.is_ancestor(g, head, kept):
        return OffBranch(kept, head, behind=True)
    found = git_rewrites.same_change_in(g, kept, head, SEARCH_LIMIT)
    twin, how = found if found is not None else (None, None)
    return OffBranch(kept, head, behind=False, twin=twin, how=how)


def session_off_branch(session, g, kept: str) -> OffBranch | None:
    """``off_branch`` for the session branch's head (wherever HEAD is); None when the branch is gone."""
    head = git_ops.branch_sha(g, session.branch)
    return off_branch(g, kept, head) if head is not None else None


def backup_name(g, sha: str) -> str:
    """The branch ``resume --reset-to-kept`` keeps the user's commit on: ``cutile-perf/rewritten-<short>``."""
    return BACKUP_PREFIX + git_ops.short(g, sha)


def refuse_kept_commits_off_branch(session, g, history, commits: Iterable[str]) -> None:
    """Refuse (exit 3) when one of ``commits`` is a commit the log kept that the session branch no
    longer holds: what it claims describes code that is not there any more (``verify``)."""
    tip = git_ops.branch_sha(g, session.branch)
    kept_rows = {e.commit: e.iteration for e in history.entries if e.kept and e.commit}
    for commit in commits:
        if commit in kept_rows and (tip is None or not git_ops.is_ancestor(g, commit, tip)):
            off = session_off_branch(session, g, history.kept_commit())
            hint = off.fix(g) if off is not None else ("name commits the branch holds with --from and --to "
                                                       "(`cutile-perf status --all` lists the kept rows)")
            raise Refused(f"the kept commit {git_ops.short(g, commit)} (iteration {kept_rows[commit]}) is no longer "
                          f"on branch {session.branch}: the code it was kept for is not the branch's any more", hint)
