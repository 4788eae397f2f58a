"""Red team: the loop attacked the way a hostile agent (or a hostile environment) would attack it.

Issue 9 lists the attacks that the loop accepted; each test below mounts one of them on the
simulated TileGym-shaped repository (tests/fixtures_repo.py) through the real CLI and real pytest
children, and then asserts the promise:

    not kept, nothing lost  (``assert_not_kept_nothing_lost``): HEAD is still the last kept commit,
    exactly one new row that is not a keep, the attempted change saved in the patch the row names,
    the fenced files back at HEAD's content, and every file outside the fence byte-identical (work
    tree, ignored and excluded files, ``.git/info`` and ``.git/hooks`` included).

An agent edits the kernel file, so most attacks are code appended to the simulated kernel: it runs
inside the pytest children, at import, exactly where a real kernel module's top level runs. Each
attack's code carries an ``# ATTACK <name>`` line so the saved patch can be checked for it.

The interface these tests are written against (issue 9): crash classes ``incomplete-tests``,
``bad-record``, ``tampered``, ``measured-wrong-code``; a hash-chained log; a frozen session.yaml; the
test hook ``CUTILE_PERF_TEST_KILL_AT``/``CUTILE_PERF_TEST_SIGNAL``; ``review: true`` rows;
``cutile-perf verify``. Against the pre-issue-9 loop every test here fails except the ones marked
"passes today" in their docstring (the attack was already stopped; the test pins it).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from fixtures_repo import KERNEL_REL, TEST_REL, allow_no_gpu, build_tilegym_like_repo, edit_kernel, edit_session, git
from redteam_helpers import (FAST, SLOW, _template, append_to_kernel, assert_not_kept_nothing_lost, call,  # noqa: F401
                             git_blob, head, killed_by, reap, recorded_groups, repo, resume_and_check, rows, snapshot,
                             spawn, start_session, wait_until)

from cutile_perf.child import box
from cutile_perf.store import session as session_mod
from cutile_perf.judge.rules import Thresholds

BASE_LATENCY = {"256x1024": 1.0, "4096x1024": 2.0}
STEPS = ("started", "committed", "measured", "decided", "recorded", "settled")


# ==================================================================================================
# 1. The reference: repeated small regressions must not ratchet HEAD slower
# ==================================================================================================


@pytest.mark.slow
def test_ratchet_of_repeated_4_percent_slowdowns_never_drifts_past_the_gate(tmp_path, monkeypatch):
    """Issue 9: with ~3 % run-to-run noise, repeated +4 % steps on one shape were kept 7-10 times
    (HEAD 1.32x-1.54x slower) because each was compared with the last *kept* commit.

    The jitter is one reproducible sequence. At this noise the bound is a rate, not a certainty: it
    held in 285 of 300 simulated sessions (``python benchmarks/decision_power.py --noise 0.12
    --steps 6``), and with unseeded jitter this test failed in CI about that often."""
    monkeypatch.setenv("FAKEGYM_JITTER_COUNTER", str(tmp_path / "jitter-counter"))
    monkeypatch.setenv("CUTILE_PERF_SANDBOX", "off")  # the box would hide the counter and its variable from the child
    repo = build_tilegym_like_repo(tmp_path)
    edit_kernel(repo, noise=0.12)  # per-sample jitter; the median of 9 moves ~3 % run to run
    git(repo, "commit", "-qam", "noisier simulated kernel")
    start_session(repo, repeats=3)
    latency = dict(BASE_LATENCY)
    for step in range(6):
        latency["256x1024"] = round(latency["256x1024"] * 1.04, 6)
        edit_kernel(repo, latency=latency)
        code, data, _ = call(repo, "try", f"step {step}: 4 % slower on 256x1024")
        assert code in (0, 1, 4), data
        if code != 0:  # reverted: the next step starts again from what is kept
            latency = _kept_latency(repo)
    drift = _kept_latency(repo)["256x1024"] / BASE_LATENCY["256x1024"] - 1
    # Issue 9: the kept HEAD never drifts beyond the gate on any shape, however many "within noise"
    # keeps came before (six kept steps, +26.5 %, were the result before the fix). The gate is the
    # single-run rule's: noise_k x the baseline's noise floor of that shape.
    baseline = rows(repo)[0]
    gate = max(Thresholds().regression_tolerance, Thresholds().noise_k * baseline["noise"]["256x1024"])
    assert drift <= gate, f"HEAD drifted +{drift:.1%} on 256x1024 in 4 % steps (gate {gate:.1%})"


def _kept_latency(repo: Path) -> dict[str, float]:
    namespace: dict = {}
    for line in git_blob(repo, "HEAD", KERNEL_REL).decode().splitlines():
        if line.startswith("LATENCY_MS = "):
            exec(line, namespace)  # noqa: S102 - our own fixture's literal
    return namespace["LATENCY_MS"]


# ==================================================================================================
# 2. Exit codes are not evidence: skipped, xfailed or never-run correctness tests
# ==================================================================================================

# Finds pytest's config from the import stack (the test module imports the kernel while pytest
# collects it) and registers a plugin: the kernel module can reach into the test run it is part of.
PLUGIN_FROM_KERNEL = '''
# ATTACK {name}
import inspect as _inspect
import os as _os

import pytest as _pytest

BEHAVIOUR = "wrong"  # the kernel is broken...


def _config():
    for _frame in _inspect.stack():
        _cfg = getattr(_frame.frame.f_locals.get("self"), "config", None)
        if _cfg is not None and hasattr(_cfg, "pluginmanager"):
            return _cfg


class _Cheat:
    @_pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if item.name.startswith("test_op"):
{action}
        else:
            globals()["BEHAVIOUR"] = "ok"  # ...but the perf test sees a working one


_cfg = _config()
if _cfg is not None and not _cfg.pluginmanager.has_plugin("cheat"):
    _cfg.pluginmanager.register(_Cheat(), "cheat")
'''

CORRECTNESS_DODGES = {
    "skip": '            _pytest.skip("needs sm_100")',
    "xfail": '            item.add_marker(_pytest.mark.xfail(reason="known flaky"))',
    "os-exit-0": "            _os._exit(0)  # 'success', before any correctness test can fail",
}


@pytest.mark.usefixtures("runtime_defences_only")
@pytest.mark.parametrize("dodge", sorted(CORRECTNESS_DODGES))
def test_correctness_tests_that_do_not_pass_are_not_evidence(repo, dodge):
    """A wrong, faster kernel whose correctness tests skip, xfail, or exit 0 mid-run is kept today."""
    before = snapshot(repo)
    edit_kernel(repo, latency=FAST)
    append_to_kernel(repo, PLUGIN_FROM_KERNEL.format(name=dodge, action=CORRECTNESS_DODGES[dodge]))
    code, data, _ = call(repo, "try", f"faster ({dodge})")
    row = assert_not_kept_nothing_lost(repo, before, code, marker=f"# ATTACK {dodge}")
    assert (row["status"], row.get("crash_class")) == ("crash", "incomplete-tests"), row


# ==================================================================================================
# 3. Shadowing: files git does not show change what runs
# ==================================================================================================


def test_conftest_hidden_by_git_info_exclude_does_not_reach_the_measurement(repo):
    """An untracked tests/ops/conftest.py, hidden with .git/info/exclude, patches the kernel back to
    'working' and 4x faster: kept today at -75 % with a wrong kernel."""
    (repo / "tests/ops/conftest.py").write_text(
        "import pytest\n\n\n@pytest.fixture(autouse=True)\ndef _faster(monkeypatch):\n"
        "    from fakegym.ops.cutile import rms_norm as k\n"
        "    monkeypatch.setattr(k, 'BEHAVIOUR', 'ok')\n"
        "    monkeypatch.setattr(k, 'LATENCY_MS', {s: v / 4 for s, v in k.LATENCY_MS.items()})\n")
    with (repo / ".git/info/exclude").open("a") as fh:
        fh.write("tests/ops/conftest.py\n")
    assert git(repo, "status", "--porcelain").strip() == ""  # git shows nothing
    before = snapshot(repo)
    edit_kernel(repo, behaviour="wrong")
    append_to_kernel(repo, "# ATTACK hidden-conftest")
    code, data, _ = call(repo, "try", "rewrite (helped by a hidden conftest)")
    assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK hidden-conftest")


def test_forged_bytecode_for_an_unfenced_module_does_not_reach_the_measurement(repo):
    """A __pycache__/*.pyc whose header matches the (unchanged, unfenced) package __init__.py, but
    whose code patches the kernel: Python loads it instead of the source. Kept today."""
    init = repo / "src/fakegym/ops/cutile/__init__.py"
    forged = ("import importlib as _il\n"
              "_k = _il.import_module(__name__ + '.rms_norm')\n"
              "_k.BEHAVIOUR = 'ok'\n"
              "_k.LATENCY_MS = {s: v / 4 for s, v in _k.LATENCY_MS.items()}\n")
    code_obj = compile(forged, str(init), "exec")
    st = init.stat()
    from importlib._bootstrap_external import _code_to_timestamp_pyc  # the writer py_compile uses

    pyc = Path(importlib.util.cache_from_source(str(init)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(bytes(_code_to_timestamp_pyc(code_obj, int(st.st_mtime), st.st_size)))
    with (repo / ".git/info/exclude").open("a") as fh:
        fh.write("__pycache__/\n")
    before = snapshot(repo)
    edit_kernel(repo, behaviour="wrong")
    append_to_kernel(repo, "# ATTACK forged-pyc")
    code, data, _ = call(repo, "try", "rewrite (helped by forged bytecode)")
    assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK forged-pyc")


# Planted by the candidate, at import in every child: bytecode for the package's (unfenced,
# unchanged) __init__.py that, when a later child reads it, makes the kernel report a quarter of its
# latency. ``where`` is the code that sets ``_pyc``, the file it writes.
def _planted_bytecode(name: str, where: str) -> str:
    return f"""
# ATTACK {name}
import importlib.util as _ilu, pathlib as _pl, sys as _sys
from importlib._bootstrap_external import _code_to_timestamp_pyc as _as_pyc
_init = _pl.Path(__file__).with_name("__init__.py")
_code = compile("import importlib as _il\\n_k = _il.import_module(__name__ + '.rms_norm')\\n"
                "_k.LATENCY_MS = {{s: v / 4 for s, v in _k.LATENCY_MS.items()}}\\n", str(_init), "exec")
_st = _init.stat()
try:
    {where}
    _pyc.parent.mkdir(parents=True, exist_ok=True)
    _pyc.write_bytes(bytes(_as_pyc(_code, int(_st.st_mtime), _st.st_size)))
except (OSError, TypeError):
    pass
"""


# In the checkout's own __pycache__, where Python looks without a bytecode prefix.
PLANTED_BYTECODE = _planted_bytecode(
    "planted-bytecode", '_pyc = _init.parent / "__pycache__" / f"__init__.{_sys.implementation.cache_tag}.pyc"')


@pytest.mark.skipif(box.available() is not None, reason="installed bytecode is read only by boxed children")
def test_bytecode_planted_by_one_child_never_reaches_the_next_child_of_its_checkout(tmp_path, monkeypatch):
    """Correctness and perf run one after the other in one checkout (no pre-started perf child).
    Without the installed-code bytecode folder (whose prefix keeps a child from reading any
    ``__pycache__``: the next test), a boxed child reads installed packages' own bytecode, so the
    checkout is the only place a planted .pyc could come from: without ``pristine.sweep`` between
    the children, the perf child loads the forged __init__ and a 3x slower kernel is kept as 2x faster."""
    monkeypatch.setenv("CUTILE_PERF_INSTALLED_BYTECODE", "0")
    repo = build_tilegym_like_repo(tmp_path)
    start_session(repo, init_args=("--no-prestart-perf",))
    before = snapshot(repo)
    edit_kernel(repo, latency=SLOW)
    append_to_kernel(repo, PLANTED_BYTECODE)
    code, data, _ = call(repo, "try", "slower, helped by bytecode planted for the next child")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK planted-bytecode")
    assert row["status"] == "revert" and row["correctness"] == "PASS", row


# The same forged __init__, written where a child with a bytecode prefix looks first: the folder of
# installed-code bytecode the harness shares between its boxed children (child/bytecode.py). The
# checkout's path in the box is the same for every child, so a .pyc planted there for the
# checkout's own __init__ would load in the next child, and the sweep never looks in that folder.
# (Without a prefix, ``cache_from_source`` names the checkout's __pycache__, which the sweep empties.)
PLANTED_IN_PREFIX = _planted_bytecode("planted-bytecode-in-prefix", "_pyc = _pl.Path(_ilu.cache_from_source(str(_init)))")


@pytest.mark.skipif(box.available() is not None, reason="the installed-code bytecode is given to boxed children only")
def test_bytecode_planted_in_the_shared_prefix_never_reaches_the_next_child(tmp_path):
    """The boxed children read the installed-code bytecode the harness compiled, from a folder
    they all share (``child.bytecode``). The candidate's correctness child plants a forged
    ``__init__`` .pyc there for the perf child: the box shows that folder read-only, so the
    3x slower kernel is reverted. With the folder writable, it is kept as 2x faster."""
    from cutile_perf.child import bytecode

    repo = build_tilegym_like_repo(tmp_path)
    start_session(repo, init_args=("--no-prestart-perf",))
    assert bytecode.is_filled(bytecode.folder(), ("pytest",))  # the children had the prefix to attack
    before = snapshot(repo)
    edit_kernel(repo, latency=SLOW)
    append_to_kernel(repo, PLANTED_IN_PREFIX)
    code, data, _ = call(repo, "try", "slower, helped by bytecode planted in the shared prefix")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK planted-bytecode-in-prefix")
    assert row["status"] == "revert" and row["correctness"] == "PASS", row
    assert "installed_bytecode" not in row, row  # no "why not": the children read the prefix


def test_package_imported_from_another_copy_is_never_measured(repo, tmp_path, monkeypatch):
    """The H200 incident: the target package importable from a pristine copy that loads first, so
    the candidate never runs and a real regression is kept as 'within noise'."""
    other = tmp_path / "other-checkout"
    shutil.copytree(repo / "src", other / "src")  # the pristine kernel, as an editable install elsewhere
    (other / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(other / 'src')!r})\nimport fakegym.ops.cutile.rms_norm\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(other), os.environ.get("PYTHONPATH")) if p))
    before = snapshot(repo)
    edit_kernel(repo, latency=SLOW)  # 50 % slower: only measuring the other copy could keep it
    append_to_kernel(repo, "# ATTACK other-copy-on-path")
    code, data, _ = call(repo, "try", "slower, but the old copy is what runs")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK other-copy-on-path")
    # Either the candidate ran (and was slower), or the foreign import was caught.
    assert row["status"] == "revert" or row.get("crash_class") == "measured-wrong-code", row


# ==================================================================================================
# 4. Run-time tampering from inside the kernel module
# ==================================================================================================

# Where is the session? The kernel runs in a checkout whose location it does not know, so it looks
# where an attacker would: the records file's directory, the working directory and its parents, and
# the repository that a git worktree belongs to.
FIND_SANDBOX = '''
import os as _os
import pathlib as _pl
import subprocess as _sp


def _sandboxes():
    seen = []
    starts = [_pl.Path.cwd(), *_pl.Path.cwd().parents, _pl.Path(__REPO__)]
    if _os.environ.get("CUTILE_PERF_RECORDS"):
        starts += list(_pl.Path(_os.environ["CUTILE_PERF_RECORDS"]).parents)
    try:
        common = _sp.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
                         capture_output=True, text=True, timeout=5).stdout.strip()
        if common:
            starts.append(_pl.Path(common).parent)
    except Exception:
        pass
    for start in starts:
        for cand in (start / "sandbox", start):
            if (cand / "session.yaml").is_file() and cand not in seen:
                seen.append(cand)
    return seen
'''


def test_kernel_that_rewrites_the_test_file_and_restores_it_is_caught(repo):
    """The kernel, imported by the correctness run, rewrites the test file so the *perf* run reports
    10x faster, and restores it when the perf run exits: the tree looks untouched. Kept today at -90 %."""
    before = snapshot(repo)
    edit_kernel(repo, latency=dict(BASE_LATENCY))
    append_to_kernel(repo, '''
# ATTACK rewrite-test
import atexit as _atexit
import pathlib as _pl

_T = _pl.Path(__file__).resolve().parents[4] / "tests/ops/test_rms_norm.py"
_LINE = "kernel.LATENCY_MS = {s: v / 10 for s, v in kernel.LATENCY_MS.items()}  # rewritten\\n"
_ANCHOR = "from fakegym.ops.cutile import rms_norm as kernel\\n"
if _T.is_file():
    _text = _T.read_text()
    if _LINE in _text:  # the perf run already compiled the rewritten file: put it back at exit
        _atexit.register(lambda: _T.write_text(_text.replace(_LINE, "")))
    else:
        _T.write_text(_text.replace(_ANCHOR, _ANCHOR + _LINE))
''')
    code, data, _ = call(repo, "try", "faster (the tests say so)")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK rewrite-test")
    assert row.get("crash_class") == "tampered", row


@pytest.mark.usefixtures("runtime_defences_only")
def test_fake_records_appended_by_the_kernel_are_caught(repo):
    """At exit of the perf run the kernel appends a 10x faster copy of every record to the records
    file (the path is in CUTILE_PERF_RECORDS or CUTILE_PERF_REPORT, or found under sandbox/)."""
    before = snapshot(repo)
    append_to_kernel(repo, FIND_SANDBOX + '''
# ATTACK fake-records
import atexit as _atexit
import json as _json


def _forge():
    files = [_pl.Path(_os.environ[v]) for v in ("CUTILE_PERF_RECORDS", "CUTILE_PERF_REPORT") if _os.environ.get(v)]
    for box in _sandboxes():
        files += sorted(box.glob("**/*records*"))
    for path in files:
        if not path.is_file():
            continue
        forged = []
        for line in path.read_text().splitlines():
            try:
                rec = _json.loads(line)
                for fw in rec["benchmark"].values():
                    for stats in fw.values():
                        for key in ("mean", "median", "min", "max"):
                            stats[key] = stats[key] / 10
                forged.append(_json.dumps(rec))
            except Exception:
                pass
        with path.open("a") as fh:
            fh.write("".join(line + "\\n" for line in forged))


_atexit.register(_forge)
''')
    code, data, _ = call(repo, "try", "faster (per the records)")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK fake-records")
    assert row.get("crash_class") in ("bad-record", "tampered"), row


@pytest.mark.usefixtures("runtime_defences_only")
@pytest.mark.parametrize("how", ["truncate", "inflate"])
def test_kernel_that_alters_the_log_neither_wins_nor_bricks_the_session(repo, how, monkeypatch):
    """The kernel truncates sandbox/experiments.jsonl, or appends a forged baseline row with
    inflated medians so that later candidates look faster. Today: kept, or the session is bricked."""
    monkeypatch.setenv("CUTILE_PERF_SANDBOX", "off")  # the check behind the box: in it the attack cannot reach the log (test_box.py)
    forged_row = json.dumps({"iteration": 0, "optimization": "baseline", "status": "keep", "correctness": "PASS",
                             "latency_ms": 100.0, "shapes": {s: {"median": 100.0} for s in BASE_LATENCY}})
    action = ("    log.write_text('')" if how == "truncate"
              else f"    with log.open('a') as fh:\n        fh.write({forged_row!r} + '\\n')")
    before = snapshot(repo)
    append_to_kernel(repo, FIND_SANDBOX + f'''
# ATTACK log-{how}
for _box in _sandboxes():
    log = _box / "experiments.jsonl"
{action}
''')
    code, data, _ = call(repo, "try", f"comment only ({how} the log)")
    row = assert_not_kept_nothing_lost(repo, before, code, marker=f"# ATTACK log-{how}")
    assert row.get("crash_class") == "tampered", row
    # Not bricked: the log reads as a whole chain, and an honest slower change is still judged
    # against the true baseline (the forged 100 ms one would call it 97 % faster).
    assert call(repo, "status")[0] == 0
    assert [r["iteration"] for r in rows(repo)] == [0, 1]
    edit_kernel(repo, latency=SLOW)
    code, data, _ = call(repo, "try", "honest, 50 % slower")
    assert code == 1 and data.get("decision") == "revert", data


@pytest.mark.usefixtures("runtime_defences_only")
def test_kernel_that_widens_the_fence_in_session_yaml_is_caught(repo, monkeypatch):
    """The kernel adds the test file to the fence in sandbox/session.yaml, so the next `try` may
    edit the tests. Today the widened fence is simply used."""
    monkeypatch.setenv("CUTILE_PERF_SANDBOX", "off")  # the check behind the box: in it the attack cannot reach session.yaml (test_box.py)
    before = snapshot(repo)
    append_to_kernel(repo, FIND_SANDBOX + f'''
# ATTACK widen-fence
for _box in _sandboxes():
    _s = _box / "session.yaml"
    _text = _s.read_text()
    if "fence:\\n- {TEST_REL}" not in _text:
        _s.write_text(_text.replace("fence:\\n", "fence:\\n- {TEST_REL}\\n", 1))
''')
    code, data, _ = call(repo, "try", "comment only (widen the fence)")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK widen-fence")
    assert row.get("crash_class") == "tampered", row
    # Whatever session.yaml now says, editing the tests is still refused.
    edit_kernel(repo, latency=FAST)
    (repo / TEST_REL).write_text((repo / TEST_REL).read_text() + "\n# loosen the tolerance\n")
    code, data, _ = call(repo, "try", "now edit the tests too")
    assert code == 3, data
    assert head(repo) == before.head


def test_session_yaml_edited_after_the_baseline_is_refused(repo):
    """The fence, commands and thresholds are frozen at the baseline: a later hand edit is refused."""
    edit_session(repo, fence=[KERNEL_REL, TEST_REL])
    edit_kernel(repo, latency=FAST)
    (repo / TEST_REL).write_text((repo / TEST_REL).read_text() + "\n# loosen the tolerance\n")
    before = snapshot(repo)
    code, data, _ = call(repo, "try", "with a wider fence")
    assert code == 3, data
    assert head(repo) == before.head and len(rows(repo)) == before.rows
    assert "loosen" in (repo / TEST_REL).read_text()  # refused, not reverted: the user's edit stays


# ==================================================================================================
# 5. Kept != measured: what is committed must be what ran
# ==================================================================================================


def test_fenced_kernel_replaced_by_a_symlink_outside_the_repo_is_not_kept(repo, tmp_path):
    """Today an absolute symlink is committed and kept: the kept commit names a file nobody has."""
    outside = tmp_path / "elsewhere.py"
    text = (repo / KERNEL_REL).read_text() + "# ATTACK symlink\n"
    for shape, value in FAST.items():
        text = text.replace(f"'{shape}': {BASE_LATENCY[shape]}", f"'{shape}': {value}")
    outside.write_text(text)
    before = snapshot(repo)
    (repo / KERNEL_REL).unlink()
    (repo / KERNEL_REL).symlink_to(outside)
    code, data, _ = call(repo, "try", "kernel moved elsewhere")
    if code == 3:  # refused up front: the symlink (the user's own doing) is left alone
        assert (repo / KERNEL_REL).is_symlink() and head(repo) == before.head
        assert len(rows(repo)) == before.rows
    else:
        assert_not_kept_nothing_lost(repo, before, code)
    assert outside.read_text() == text
    assert git(repo, "ls-tree", "HEAD", KERNEL_REL).split()[0] == "100644"


def _install_clean_filter(repo: Path, sed: str) -> None:
    (repo / ".git/info/attributes").write_text("*.py filter=redteam\n")
    git(repo, "config", "filter.redteam.clean", f"sed -e '{sed}'")
    git(repo, "config", "filter.redteam.smudge", "cat")


def test_clean_filter_cannot_make_the_commit_differ_from_the_measured_code(repo):
    """A clean filter in .git/info/attributes rewrites what is committed: measured fast, committed slow."""
    slow_line = f"LATENCY_MS = {SLOW!r}"
    _install_clean_filter(repo, f's/^LATENCY_MS = .*/{slow_line}/')
    edit_kernel(repo, latency=FAST)
    append_to_kernel(repo, "# ATTACK clean-filter")
    measured = (repo / KERNEL_REL).read_bytes()
    before = snapshot(repo)
    code, data, _ = call(repo, "try", "faster in the work tree")
    if code == 0:  # kept is fine, if and only if the commit is exactly the bytes that were measured
        assert git_blob(repo, "HEAD", KERNEL_REL) == measured
    else:
        assert_not_kept_nothing_lost(repo, before, code, refused_ok=True)


def test_clean_filter_never_drops_the_users_lines_from_the_saved_patch(repo, tmp_path):
    """On a revert the saved patch must give back the user's exact bytes; today the filtered lines
    are missing from it and the edit is lost."""
    _install_clean_filter(repo, "/# keep this line/d")
    edit_kernel(repo, latency=SLOW)
    append_to_kernel(repo, "# keep this line: the user's note")
    edited = (repo / KERNEL_REL).read_bytes()
    before = snapshot(repo)
    code, data, _ = call(repo, "try", "slower, with a note")
    row = assert_not_kept_nothing_lost(repo, before, code, refused_ok=True)
    if row is None:
        return
    assert "# keep this line: the user's note" in (repo / row["patch"]).read_text(), \
        "the filtered line is missing from the saved patch"
    # Applied to the base version outside any repository (no filters), the patch gives back the user's bytes.
    scratch = tmp_path / "apply"
    (scratch / KERNEL_REL).parent.mkdir(parents=True)
    (scratch / KERNEL_REL).write_bytes(git_blob(repo, before.head, KERNEL_REL))
    applied = subprocess.run(["git", "apply", str(repo / row["patch"])], cwd=scratch, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert (scratch / KERNEL_REL).read_bytes() == edited


def test_post_checkout_hook_cannot_change_the_measured_or_the_restored_kernel(repo):
    """A post-checkout hook that makes the kernel fast in every checkout: a slow candidate would be
    measured fast in a fresh checkout, and after a revert the user's tree is left modified."""
    hook = repo / ".git/hooks/post-checkout"
    hook.write_text("#!/bin/sh\n"
                    f"f={KERNEL_REL}\n"
                    f"[ -f \"$f\" ] && sed -i 's/^LATENCY_MS = .*/LATENCY_MS = {FAST!r}/' \"$f\"\n"
                    "exit 0\n")
    hook.chmod(0o755)
    before = snapshot(repo)
    edit_kernel(repo, latency=SLOW)
    append_to_kernel(repo, "# ATTACK post-checkout")
    code, data, _ = call(repo, "try", "slower (the hook makes it look fast)")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK post-checkout")
    assert row["status"] == "revert", row  # measured slow: the hook did not run in the checkout


# ==================================================================================================
# 6. Records: only finite, positive, plausible numbers count
# ==================================================================================================


@pytest.mark.parametrize("median", [math.nan, math.inf, 0.0, -1.0, 1e-300], ids=["nan", "inf", "zero", "negative",
                                                                              "1e-300"])
def test_impossible_medians_are_a_bad_record_not_a_keep_or_a_bug(repo, median):
    """nan/inf/0/negative ended in exit 70 with a row claiming correctness FAIL; 1e-300 on one
    shape was kept as -100 % and poisoned the baseline."""
    before = snapshot(repo)
    append_to_kernel(repo, f"# ATTACK median\nLATENCY_MS = {{'256x1024': float({str(median)!r}), '4096x1024': 2.0}}")
    code, data, _ = call(repo, "try", f"median {median}")
    assert code != 70, data
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK median")
    if median != 1e-300:
        assert (code, row.get("crash_class"), row.get("correctness")) == (4, "bad-record", "PASS"), row


def test_implausible_speedup_is_re_measured_and_marked_for_review(repo):
    """A claimed 5x on a shape (over the default 3x plausibility factor) is re-measured before it
    can be kept, and its row says `review: true`."""
    edit_kernel(repo, latency={s: v / 5 for s, v in BASE_LATENCY.items()})
    code, data, _ = call(repo, "try", "5x faster")
    assert code == 0, data
    assert rows(repo)[-1].get("review") is True, rows(repo)[-1]
    assert "keep (review)" in (repo / "sandbox/perf_results.md").read_text()
    assert call(repo, "report")[0] == 0 and "For review" in (repo / "sandbox/report.md").read_text()


# ==================================================================================================
# 7. The log: hash-chained, and every loop command checks it
# ==================================================================================================


def test_hand_edited_log_is_refused_and_status_names_the_line(repo):
    """A slower 'baseline' written into the log by hand would make every candidate look faster."""
    edit_kernel(repo, latency=FAST)
    assert call(repo, "try", "kept one")[0] == 0
    log = repo / "sandbox/experiments.jsonl"
    lines = log.read_text().splitlines()
    first = json.loads(lines[0])
    first["latency_ms"] = first["latency_ms"] * 2
    for shape in first.get("shapes", {}).values():
        shape["median"] = shape["median"] * 2
    log.write_text("".join(line + "\n" for line in [json.dumps(first, sort_keys=True), *lines[1:]]))
    edit_kernel(repo, latency={s: v / 2 for s, v in FAST.items()})
    for command, args in (("try", ("x",)), ("baseline", ("--repeats", "1")), ("resume", ())):
        code, data, _ = call(repo, command, *args)
        assert code == 3, (command, data)
    code, data, text = call(repo, "status")
    assert re.search(r"line [12]\b", text), text  # the edited row, or the first row whose `prev` no longer matches


def test_truncated_log_is_refused_and_status_names_the_line(repo):
    edit_kernel(repo, latency=FAST)
    assert call(repo, "try", "kept one")[0] == 0
    log = repo / "sandbox/experiments.jsonl"
    log.write_text(log.read_text().splitlines()[0] + "\n")  # the kept row is gone
    edit_kernel(repo, latency={s: v / 2 for s, v in FAST.items()})
    code, data, _ = call(repo, "try", "after the truncation")
    assert code == 3, data
    code, data, text = call(repo, "status")
    assert "line" in text and ("truncat" in text or "missing" in text or "break" in text), text


# ==================================================================================================
# 8. Interrupts: every step of the transaction, every signal
# ==================================================================================================

@pytest.mark.parametrize("sig", ["KILL", pytest.param("INT", marks=pytest.mark.slow),
                                 pytest.param("TERM", marks=pytest.mark.slow)])
@pytest.mark.parametrize("step", STEPS)
def test_killed_at_each_step_resume_reaches_one_consistent_state(repo, reap, step, sig):
    """The test hook kills `try` right after it persists ``step``; `resume` must then leave one
    consistent state: no duplicate or phantom row, the patch named, no child left running."""
    before = snapshot(repo)
    edit_kernel(repo, latency=SLOW)  # a revert: whatever the step, "not kept" is the right end state
    append_to_kernel(repo, "# ATTACK killed")
    tag = uuid.uuid4().hex
    proc = spawn(repo, "try", f"killed at {step}", env={
        "CUTILE_PERF_TEST_KILL_AT": step, "CUTILE_PERF_TEST_SIGNAL": sig, "REDTEAM_TAG": tag})
    out, err = proc.communicate(timeout=120)
    assert killed_by(proc.returncode, sig), f"exit {proc.returncode}, not killed by SIG{sig} at {step}: {err[-500:]}"
    resume_and_check(repo, before, tag, reap, marker="# ATTACK killed")


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_interrupt_right_after_the_keep_row_resumes_to_the_keep(repo, reap, sig):
    """Issue 9: SIGINT right after the keep row was written left `try` saying 'run resume' and
    `resume` refusing. The keep is on disk: resume must finish it, not undo it or refuse."""
    edit_kernel(repo, latency=FAST)
    tag = uuid.uuid4().hex
    proc = spawn(repo, "try", "faster, interrupted after recording",
                 env={"CUTILE_PERF_TEST_KILL_AT": "recorded", "CUTILE_PERF_TEST_SIGNAL": sig, "REDTEAM_TAG": tag})
    proc.communicate(timeout=120)
    assert killed_by(proc.returncode, sig), proc.returncode
    code, data, _ = call(repo, "resume")
    assert code == 0 and data.get("consistent"), data
    kept = [r for r in rows(repo) if r["iteration"] == 1]
    assert len(kept) == 1 and kept[0]["status"] == "keep", kept
    assert head(repo) == kept[0]["commit"] and git(repo, "status", "--porcelain").strip() == ""


def test_kill_9_during_a_hung_run_leaves_no_child_for_resume_or_the_next_try(repo, reap, tmp_path):
    """Today the pytest child of a SIGKILLed `try` keeps running through `resume` and the next `try`."""
    before = snapshot(repo)
    edit_kernel(repo, sleep=60)  # every simulated test hangs
    append_to_kernel(repo, "# ATTACK hung")
    tag = uuid.uuid4().hex
    proc = spawn(repo, "try", "hangs", env={"REDTEAM_TAG": tag})
    try:
        # The child cannot write outside its checkout (the sandbox): its recorded group says it started.
        wait_until(lambda: bool(recorded_groups(repo)), 60, "the pytest child to start")
        time.sleep(3.0)  # it imports the kernel, then every test hangs
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    resume_and_check(repo, before, tag, reap, marker="# ATTACK hung")


def test_unwritable_perf_results_md_does_not_wedge_the_session(repo):
    """A failing perf_results.md write after the row was logged: try must still end consistent,
    or leave a state that resume finishes (today: 'run resume', then resume refuses)."""
    results = repo / "sandbox/perf_results.md"
    results.unlink()
    results.mkdir()  # a directory where the file goes: the atomic replace fails, even as root
    before = snapshot(repo)
    edit_kernel(repo, latency=SLOW)
    append_to_kernel(repo, "# ATTACK results-md")
    code, data, _ = call(repo, "try", "slower")
    assert code != 70, data
    code, data, _ = call(repo, "resume")
    assert code == 0 and data.get("consistent"), data
    assert_not_kept_nothing_lost(repo, before, marker="# ATTACK results-md")


# ==================================================================================================
# 9. Bad input: one line, exit 2, nothing touched
# ==================================================================================================


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-5"])
def test_init_rejects_a_timeout_that_is_not_a_positive_finite_number(tmp_path, timeout):
    """0 and -5 pass today; nan and inf were accepted, and nan disabled the hang guard."""
    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--timeout", timeout)
    assert code == 2 and "timeout" in data.get("error", ""), data
    _assert_untouched(repo)


def test_init_in_a_repo_without_commits_is_a_usage_error(tmp_path):
    repo = tmp_path / "fresh"
    shutil.copytree(build_tilegym_like_repo(tmp_path / "src"), repo, ignore=shutil.ignore_patterns(".git"))
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    code, data, _ = call(repo, "init", "--kernel", "rms_norm")
    assert code == 2, data
    assert not (repo / "sandbox").exists()


def test_init_with_a_branch_name_git_rejects_is_a_usage_error(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--branch", "bad..name")
    assert code == 2 and "branch" in data.get("error", ""), data
    _assert_untouched(repo)


def test_misspelt_threshold_key_is_a_usage_error_before_anything_runs(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    assert call(repo, "init", "--kernel", "rms_norm")[0] == 0
    allow_no_gpu(repo)
    edit_session(repo, thresholds={"noise_kk": 2.0})
    code, data, _ = call(repo, "baseline", "--repeats", "1")
    assert code == 2 and "noise_kk" in data.get("error", ""), data
    assert not (repo / "sandbox/experiments.jsonl").exists() and not (repo / "sandbox/runs").exists()


def _assert_untouched(repo: Path) -> None:
    assert not (repo / "sandbox").exists()
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git(repo, "branch", "--list").split() == ["*", "main"]
    assert git(repo, "status", "--porcelain", "--ignored").strip() == ""


def test_harness_bytecode_is_not_a_change_in_a_repo_without_gitignore(repo, monkeypatch):
    """No .gitignore and bytecode writing on: today the children's __pycache__ makes every later
    `try` a fence violation."""
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    assert not (repo / ".gitignore").exists()
    edit_kernel(repo, latency=FAST)
    code, data, _ = call(repo, "try", "faster")
    assert code == 0, data
    edit_kernel(repo, latency={s: v / 2 for s, v in FAST.items()})
    code, data, _ = call(repo, "try", "faster again")
    assert code == 0, data
    assert git(repo, "status", "--porcelain").strip() == ""


def test_read_only_log_names_the_saved_patch(repo):
    """A log that cannot be written: the tree may be reset only if the message names the saved patch."""
    log = repo / "sandbox/experiments.jsonl"
    before = snapshot(repo)
    edit_kernel(repo, latency=SLOW)
    append_to_kernel(repo, "# ATTACK read-only-log")
    with _unwritable(log):
        code, data, text = call(repo, "try", "slower, log read-only")
    if code == 3:  # refused up front: the edit is still in the tree
        assert "# ATTACK read-only-log" in (repo / KERNEL_REL).read_text()
        return
    assert code not in (0, 70), data
    named = [w.strip(".,;:()'\"") for w in text.replace("\\n", " ").split() if "sandbox/patches/" in w]
    assert named, f"the message names no saved patch: {text[-600:]}"
    assert any(("# ATTACK read-only-log" in (repo / n).read_text()) for n in named if (repo / n).is_file())
    assert head(repo) == before.head
    code, data, _ = call(repo, "resume")  # once the log is writable again, the row is logged
    assert code == 0 and data.get("consistent"), data
    assert any(Path(n).name in json.dumps(r) for r in rows(repo)[before.rows:] for n in named)


@contextlib.contextmanager
def _unwritable(path: Path):
    """Make ``path`` unwritable, also for root (chattr +i), or skip where that is impossible."""
    path.chmod(0o444)
    immutable = False
    if os.access(path, os.W_OK):  # root ignores the mode
        immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
        if not immutable:
            path.chmod(0o644)
            pytest.skip("cannot make a file unwritable here (root without chattr +i)")
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=False)
        path.chmod(0o644)


# ==================================================================================================
# 10. Evidence a reviewer can re-check from git alone
# ==================================================================================================


def test_verify_reproduces_an_honest_keep(repo):
    base = head(repo)
    edit_kernel(repo, latency=FAST)
    assert call(repo, "try", "faster")[0] == 0
    code, data, _ = call(repo, "verify")
    assert code == 0, data
    code, data, _ = call(repo, "verify", "--from", base, "--to", head(repo))
    assert code == 0, data
    code, data, _ = call(repo, "verify", "--full-tests")  # init's selection is the session's here
    assert code == 0 and data["full_tests"], data


WIDE_ROWS_TEST = """

@pytest.mark.parametrize("backend", ["cutile"])
def test_wide_rows(backend):  # a correctness test the narrowed session command leaves out
    assert getattr(kernel, "WIDE_ROWS_OK", True), "wide rows: mismatched elements"
"""


@pytest.mark.parametrize("broken_before", [False, True], ids=["new-failure", "old-failure"])
def test_verify_full_tests_catches_what_a_narrowed_correctness_command_let_through(tmp_path, broken_before):
    """An agent narrows the correctness command before its baseline (seen in a live eval), then
    keeps a faster change that breaks a test the narrowed command leaves out. The kept row stands
    under the session's own rules; `verify --full-tests` re-runs init's selection and says whether
    the failure is new with the change or was already there."""
    repo = build_tilegym_like_repo(tmp_path)
    (repo / TEST_REL).write_text((repo / TEST_REL).read_text() + WIDE_ROWS_TEST)
    if broken_before:
        (repo / KERNEL_REL).write_text((repo / KERNEL_REL).read_text() + "\nWIDE_ROWS_OK = False\n")
    git(repo, "commit", "-qam", "the user's wide-rows test")
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--timeout", "60")
    assert code == 0, data
    allow_no_gpu(repo)
    edit_session(repo, correctness_cmd=session_mod.CORRECTNESS_TEMPLATE.replace(
        "not test_perf", "not test_perf and not wide_rows"))
    assert call(repo, "baseline", "--repeats", "2")[0] == 0
    base = head(repo)
    edit_kernel(repo, latency=FAST)
    if not broken_before:
        (repo / KERNEL_REL).write_text((repo / KERNEL_REL).read_text() + "\nWIDE_ROWS_OK = False\n")
    assert call(repo, "try", "faster, wide rows broken")[0] == 0  # kept: the narrowed command never ran it
    code, data, _ = call(repo, "verify", "--from", base, "--to", head(repo))
    assert code == 0 and data["verified"], data
    code, data, _ = call(repo, "verify", "--from", base, "--to", head(repo), "--full-tests")
    assert code == 1 and not data["verified"] and data["full_tests"], data
    assert "test_wide_rows[cutile]" in data["correctness"] and data["fails_on_from_too"] is broken_before


def test_verify_fails_when_the_kept_commit_was_rewritten_to_slower_code(repo):
    """A hand-amended kept commit (same message and trailers, slower code): the claim must not reproduce."""
    base = head(repo)
    edit_kernel(repo, latency=FAST)
    assert call(repo, "try", "faster")[0] == 0
    edit_kernel(repo, latency=SLOW)
    git(repo, "commit", "-q", "--amend", "--no-edit", "-a")
    code, data, _ = call(repo, "verify", "--from", base, "--to", head(repo))
    assert code == 1, data  # exit 1: the check ran and the recorded speedup did not reproduce
