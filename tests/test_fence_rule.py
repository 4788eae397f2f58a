"""One fence rule: ``store.session.fenced`` decides whether a path is a fenced file, and every
question about the fence (what try owns, what batch may overwrite, what adopt scans, what a
checkout takes from the candidate) asks it instead of restating it."""
from __future__ import annotations

import re

import pytest

from cutile_perf.loop import guards
from cutile_perf.store import session as session_mod
from cutile_perf.store.session import fenced
from test_architecture import PACKAGE

FENCE = ("src/pkg/", "src/other.py")
TESTS = ("tests/test_k.py", "src/pkg/perf_k.py")


@pytest.mark.parametrize("path, expected", [
    ("src/pkg/k.py", True),                  # under a fenced folder
    ("src/pkg/sub/helper.py", True),
    ("src/other.py", True),                  # a fenced file
    ("src/other.pyc", False),                # a file entry is the file, not a prefix
    ("src/pkg2/k.py", False),                # a folder entry ends with "/": no sibling matches
    ("src/pkg/conftest.py", False),          # a test configuration inside a fenced folder
    ("src/pkg/tests/x.py", False),
    ("src/pkg/perf_k.py", False),            # the session's own test file
    ("sandbox/session.yaml", False),         # the session's records, even when listed
])
def test_the_fence_rule(path, expected):
    assert fenced(path, (*FENCE, "sandbox/"), TESTS) is expected


def _session(tmp_path):
    return session_mod.Session(
        repo=tmp_path, kernel="k", kernel_files=("src/pkg/k.py",), fence=FENCE, test="tests/test_k.py",
        correctness_cmd=session_mod.CORRECTNESS_TEMPLATE, perf_cmd="{python} -m pytest src/pkg/perf_k.py -q",
        thresholds=session_mod.Thresholds(), timeout_s=60.0, base_commit="0" * 40, branch="b", created="")


def test_try_owns_the_fenced_files_and_may_also_write_scratch(tmp_path):
    session = _session(tmp_path)
    paths = ["src/pkg/k.py", "src/other.py", "sandbox/cand.py", "sandbox", "src/pkg/conftest.py", "README.md"]
    assert guards.fenced_changes(session, paths) == [p for p in paths if fenced(p, FENCE, session.test_files)]
    assert guards.fenced_changes(session, paths) == ["src/pkg/k.py", "src/other.py"]
    # sandbox/ is the agent's scratch: a change there is not "outside the fence", yet no iteration owns it.
    assert [p for p in paths if session.in_fence(p)] == ["src/pkg/k.py", "src/other.py", "sandbox/cand.py", "sandbox"]


# The idioms of a restated fence rule: a folder entry matched by hand, and "in the fence but not
# sandbox/" written out where ``Session.fenced`` says it.
RESTATED = (re.compile(r'endswith\("/"\) and \w+\.startswith\('),
            re.compile(r'in_fence\([^)]*\)\s+and\s+not\s+\w+\.startswith\('),
            re.compile(r'startswith\(\w+\) or not in_fence\('))
# child/pristine.py composes checkouts with its own copy (``_in_fence``); child/ is being reworked
# on another branch (issue 40, one child pool), which takes ``session.fenced`` there.
STILL_RESTATED = {"child/pristine.py"}


def test_the_fence_rule_is_written_once():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        text = path.read_text(encoding="utf-8")
        found += [f"{rel}: {m.group(0)}" for pattern in RESTATED for m in pattern.finditer(text)
                  if rel not in STILL_RESTATED]
    assert found == ['store/session.py: endswith("/") and path.startswith('], \
        "the fence rule restated; call store.session.fenced (or Session.fenced):\n" + "\n".join(found)
