"""Issue 44, items 2, 3 and 5: nothing a child writes can hang, crash or fill the harness.

Each class of attack is mounted the way a child would (a FIFO, a device, a 3,000-level folder, a
flood of output, a folder in place of the harness's record, invisible characters), first on the
library piece that reads or removes it, then, for the ones that wedged whole sessions, through the
real CLI on the simulated TileGym-shaped repository (``tests/fixtures_repo.py``).
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import threading
import unicodedata
from pathlib import Path

import pytest
from fixtures_repo import KERNEL_REL, edit_kernel
from redteam_helpers import (FAST, SLOW, _template, append_to_kernel, assert_not_kept_nothing_lost, call, head,  # noqa: F401
                             repo, rows, snapshot)

from cutile_perf.child import box, measure, pristine, protected, runner, runreport
from cutile_perf.errors import displayable
from cutile_perf.kernel import probes
from cutile_perf.store import jitcache, remove_tree, safe_read

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def finishes(fn, timeout_s: float = 10.0):
    """``fn()``'s result, or a test failure when it has not returned within ``timeout_s`` (a read
    that blocks on a FIFO never would: the thread is left behind, a daemon)."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"still blocked after {timeout_s} s"
    return out.get("value")


def deep_folder(top: Path, depth: int = 3000) -> None:
    """A chain of ``depth`` nested folders under ``top`` (paths longer than PATH_MAX: built by fd)."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


# --- reads of child-writable files ---------------------------------------------------------------


def test_a_fifo_in_place_of_the_run_report_is_forged_evidence_not_a_hang(tmp_path):
    report = tmp_path / "report.jsonl"
    os.mkfifo(report)
    result = finishes(lambda: runreport.read(report, b"k" * 32))
    assert result.forged and "FIFO" in result.forged[0] and not result.outcomes


@pytest.mark.parametrize("target", ["/dev/zero", "outside"])
def test_a_link_in_place_of_the_run_report_is_never_followed(tmp_path, target):
    report = tmp_path / "report.jsonl"
    outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"
    outside.write_text("{}\n")
    report.symlink_to(target if target.startswith("/") else outside)
    result = finishes(lambda: runreport.read(report, b"k" * 32))
    assert result.forged and "symlink" in result.forged[0]


def test_checkout_files_replaced_by_a_fifo_or_a_device_are_fingerprinted_never_opened(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    before = protected.digest_tree(tmp_path, ["a.py", "b.py"])
    (tmp_path / "a.py").unlink()
    os.mkfifo(tmp_path / "a.py")
    (tmp_path / "b.py").unlink()
    (tmp_path / "b.py").symlink_to("/dev/zero")
    after = finishes(lambda: protected.digest_tree(tmp_path, ["a.py", "b.py"]))
    assert after == {"a.py": "a FIFO", "b.py": "link:/dev/zero"} and after != before
    saved = finishes(lambda: protected.snapshot(tmp_path, ["a.py", "b.py"]))
    assert saved == {"a.py": "a FIFO", "b.py": "link:/dev/zero"}


def test_a_big_file_is_refused_whole_and_read_from_its_end(tmp_path):
    log = tmp_path / "big.log"
    with open(log, "wb") as fh:
        fh.seek(200 * safe_read.MB)
        fh.write(b"the end\n")
    with pytest.raises(safe_read.Unsafe, match="over the 1 MB"):
        safe_read.read_bytes(log, safe_read.MB)
    assert safe_read.tail_text(log, 8) == "the end\n"


# --- a flood of output --------------------------------------------------------------------------

FLOOD_MB = 120


def _flooded_log(path: Path, mb: int) -> None:
    with open(path, "wb") as fh:
        fh.write(b"$ pytest\n" + b"E       AssertionError: Tensor-likes are not close! Mismatched elements: 17 / 1024\n"
                 + b"FAILED tests/ops/test_rms_norm.py::test_op[cutile] - AssertionError: Tensor-likes are not close!\n")
        line = b"x" * 99 + b"\n"
        for _ in range(mb * 10):
            fh.write(line * 1000)  # ~100 KB


def test_a_wrong_result_under_a_flood_of_output_is_still_a_wrong_result(tmp_path):
    """Issue 44: the assertion pushed out of the classifier's tail made a wrong result a crash ``error``."""
    log = tmp_path / "correctness.log"
    _flooded_log(log, 20)
    result = runner.RunResult(("pytest",), 1, False, 1.0, log)
    assert runner.classify(result).value == "wrong-result"
    detail = measure.failure_detail(result, runreport.RunReport())
    assert "AssertionError" in detail


def test_the_run_reports_failure_message_classifies_when_the_log_holds_nothing(tmp_path):
    log = tmp_path / "correctness.log"
    log.write_bytes(b"x" * 100_000)
    result = runner.RunResult(("pytest",), 1, False, 1.0, log)
    assert runner.classify(result).value == "error"
    failures = {"t::test_op": "AssertionError: Tensor-likes are not close!"}
    assert runner.classify(result, failures.values()).value == "wrong-result"
    report = runreport.RunReport(failures=failures)
    assert measure.failure_detail(result, report).startswith("test_op: AssertionError")


def test_the_classifier_says_when_it_could_not_find_the_failure(tmp_path):
    log = tmp_path / "correctness.log"
    with open(log, "wb") as fh:
        fh.write(b"z" * (3 * safe_read.MB))
    result = runner.RunResult(("pytest",), 1, False, 1.0, log)
    assert "the failure was not found" in measure.failure_detail(result, runreport.RunReport())


_PEAK = """
import resource, sys
from pathlib import Path
from cutile_perf.child import measure, runner, runreport
log = Path(sys.argv[1])
result = runner.RunResult(("pytest",), 1, False, 1.0, log)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
crash = runner.classify(result)
detail = measure.failure_detail(result, runreport.RunReport())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(crash.value, (peak - before) // 1024, peak // 1024)
"""


def test_classifying_a_flooded_log_costs_no_memory_for_the_flood(tmp_path):
    """The whole log used to be read to keep its tail: a 300 MB flood took the harness to 632 MB."""
    log = tmp_path / "flood.log"
    _flooded_log(log, FLOOD_MB)
    done = subprocess.run([sys.executable, "-c", _PEAK, str(log)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(SCRIPTS)})
    crash, grew_mb, peak_mb = done.stdout.split()
    assert crash == "wrong-result"
    assert int(grew_mb) < 32, f"classifying a {FLOOD_MB} MB log grew the harness by {grew_mb} MB (peak {peak_mb} MB)"


# --- trees a child wrote ------------------------------------------------------------------------


def test_a_3000_level_folder_in_a_checkout_slot_is_removed(tmp_path):
    slot = tmp_path / "slot-0"
    deep_folder(slot / "deep")
    (slot / "d.py").write_text("")
    assert pristine.emptied_slot(slot) == slot
    assert list(slot.iterdir()) == []


def test_a_slot_that_cannot_be_emptied_is_abandoned_for_a_fresh_one_named_in_a_line(tmp_path, capsys, monkeypatch):
    slot = tmp_path / "slot-0"
    slot.mkdir()
    monkeypatch.setattr(remove_tree, "remove", lambda path: (_ for _ in ()).throw(OSError(16, "Device or resource busy")))
    fresh = pristine.emptied_slot(slot)
    try:
        assert fresh != slot and fresh.is_dir()
        line = capsys.readouterr().err
        assert "checkout slot abandoned" in line and str(slot) in line and str(fresh) in line
    finally:
        os.rmdir(fresh)


def test_orphaned_temp_folders_of_killed_commands_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    orphan = tmp_path / f"cutile-perf-run-{dead}-abc"
    live = tmp_path / f"cutile-perf-run-{os.getppid()}-abc"
    deep_folder(orphan)
    live.mkdir()
    assert remove_tree.remove_orphans("cutile-perf-run-", tmp_path) == [orphan.name]
    assert live.is_dir() and not orphan.exists()


def test_the_run_folder_is_removed_however_deep_the_child_made_it(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with remove_tree.temporary_folder("cutile-perf-run-") as private:
        deep_folder(private / "scratch")
    assert list(tmp_path.iterdir()) == []


# --- the harness's own records ----------------------------------------------------------------


def test_the_jit_manifest_lives_out_of_the_childrens_folder(tmp_path):
    """Issue 44: a child replaced ``jit-cache/manifest.json`` by a folder and every later command failed."""
    cache = tmp_path / "jit-cache"
    cache.mkdir()
    (cache / "manifest.json").mkdir()  # what a child can do in the folder it writes
    (cache / "manifest.json" / "x").write_text("")
    with jitcache.guarded(cache):
        pass
    assert jitcache.manifest_path(cache) == tmp_path / "jit-cache-manifest.json"
    assert jitcache.manifest_path(cache).is_file() and not (cache / "manifest.json").exists()


def test_an_old_sessions_manifest_is_moved_out_once_and_still_vouches(tmp_path):
    cache = tmp_path / "jit-cache"
    cache.mkdir()
    (cache / "manifest.json").write_text('{"entries": {"k": "d"}}\n')
    jitcache.migrate(cache)
    assert not (cache / "manifest.json").exists()
    assert jitcache._manifest(cache) == {"k": "d"}


def test_a_fifo_in_place_of_the_compile_cache_is_not_opened(tmp_path):
    cache = tmp_path / "jit-cache"
    cache.mkdir()
    os.mkfifo(cache / jitcache.DB_FILE)
    assert finishes(lambda: jitcache.drop_unrecorded(cache)) == [jitcache.DB_FILE]
    assert not os.path.lexists(cache / jitcache.DB_FILE)


# --- fenced files too big to scan --------------------------------------------------------------


def test_the_probe_scan_names_a_fenced_file_over_its_size():
    assert probes.too_large("k.py", probes.MAX_SOURCE_BYTES) is None
    why = probes.too_large("k.py", 10 * probes.MAX_SOURCE_BYTES)
    assert why.startswith("k.py is 10.0 MB, over the 1 MB")


# --- text shown -------------------------------------------------------------------------------


def test_every_invisible_format_character_is_stripped_from_what_is_shown():
    invisible = "".join(chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf")
    assert "\u061c" in invisible and "\U000e0041" in invisible and "\u200b" in invisible
    assert displayable(f"fa{invisible}st") == "fast"


# --- through the CLI -----------------------------------------------------------------------------

DEEP_FOLDER_ATTACK = '''
# ATTACK deep-folder
import os as _os
_fd = _os.open(".", _os.O_RDONLY)
for _ in range(3000):
    try:
        _os.mkdir("d", dir_fd=_fd)
    except FileExistsError:
        pass
    _next = _os.open("d", _os.O_RDONLY, dir_fd=_fd)
    _os.close(_fd)
    _fd = _next
_os.close(_fd)
'''


def test_a_3000_level_folder_left_in_the_checkout_wedges_nothing(repo):
    """Issue 44: every later command exited 70 with a RecursionError, honest changes logged FAIL."""
    append_to_kernel(repo, DEEP_FOLDER_ATTACK)
    edit_kernel(repo, latency=SLOW)  # reverted for its speed: the folder is the only thing it does
    before = snapshot(repo)
    code, data, _ = call(repo, "try", "leaves a deep folder in its checkout")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK deep-folder")
    assert row["crash_class"] != "harness" and row["correctness"] == "PASS", row
    edit_kernel(repo, latency=FAST)
    code, data, _ = call(repo, "try", "honest: twice as fast")
    assert code == 0, data
    assert rows(repo)[-1]["status"] == "keep" and rows(repo)[-1]["correctness"] == "PASS"


FLOOD_ATTACK = '''
# ATTACK flood
import atexit as _atexit
import os as _os

BEHAVIOUR = "wrong"


def _flood():
    _line = b"x" * 1023 + b"\\n"
    for _ in range({mb} * 1024):
        _os.write(1, _line)


_atexit.register(_flood)
'''


def test_a_wrong_result_followed_by_a_flood_is_a_revert_not_a_crash(repo):
    """The child prints 40 MB after pytest's summary: the row is still ``wrong-result`` (revert)."""
    append_to_kernel(repo, FLOOD_ATTACK.replace("{mb}", "40"))
    before = snapshot(repo)
    code, data, _ = call(repo, "try", "wrong, then floods the log")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK flood")
    assert (row["status"], row["crash_class"], row["correctness"]) == ("revert", "wrong-result", "FAIL"), row


FIFO_ATTACK = '''
# ATTACK fifo-{what}
import atexit as _atexit
import os as _os


def _swap():
    _target = {target}
    try:
        _os.unlink(_target)
    except OSError:
        pass
    _os.mkfifo(_target)


_atexit.register(_swap)
'''


@pytest.mark.skipif(box.available() is not None, reason="the attack finds the report at the box's fixed path")
@pytest.mark.parametrize("what", ["report", "checkout-file"])
def test_a_fifo_left_for_the_harness_to_read_is_tampering_not_a_hang(repo, what):
    """Issue 44: a FIFO in place of the run report or of a checkout file made ``try`` hang holding the lock."""
    # In the box the report is at a fixed path (box.RUN): no environment read the probe scan would refuse.
    target = repr(f"{box.RUN}/report.jsonl") if what == "report" else '"tests/ops/test_rms_norm.py"'
    append_to_kernel(repo, FIFO_ATTACK.replace("{what}", what).replace("{target}", target))
    before = snapshot(repo)
    code, data, _ = finishes(lambda: call(repo, "try", f"a FIFO in place of the {what}"), timeout_s=240)
    row = assert_not_kept_nothing_lost(repo, before, code, marker=f"# ATTACK fifo-{what}")
    assert row["crash_class"] == "tampered", row
    assert call(repo, "status")[0] == 0
