"""Children collected ahead of their turn (``collect_ahead``, the default): the re-check's runs and
the baseline's later runs collect before their turn, each in a checkout of its own, and are stopped
with their whole process tree while any other run is timed; one that holds the GPU is ended.

On CPU, through the real CLI, on the SIMULATED TileGym-shaped repository of ``fixtures_repo`` (its
fake tests need no GPU); ``freezer`` is tested on plain processes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from fixtures_repo import edit_kernel
from test_prestart_perf import AHEAD, BORDERLINE, TO_PERF_LOG, _slow_tests_session
from redteam_helpers import append_to_kernel, call, rows

from cutile_perf.child import freezer, runner
from cutile_perf.loop import stages

# --- freezer, on plain processes ---------------------------------------------------------------------

# A process that starts a grandchild in a session of its own (out of the group: killpg and a
# group's SIGSTOP miss it), then both print a counter every 20 ms.
ESCAPING = r'''
import os, sys, time
if os.fork() == 0:
    os.setsid()
    while True:
        print("grandchild", time.time(), flush=True); time.sleep(0.02)
while True:
    print("child", time.time(), flush=True); time.sleep(0.02)
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux only")
def test_stop_tree_stops_a_grandchild_that_left_the_group(tmp_path):
    log = tmp_path / "ticks.txt"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", ESCAPING], stdout=out, start_new_session=True)
    try:
        end = time.monotonic() + 10.0
        while not {"child", "grandchild"} <= set(log.read_text().split()) and time.monotonic() < end:
            time.sleep(0.05)
        stopped = freezer.stop_tree(proc.pid)
        assert len(stopped) == 2 and proc.pid in stopped
        # It returns once every thread has stopped, not when the signals are sent.
        assert all(set(freezer.thread_states(pid)) <= set("Tt") for pid in stopped)
        size = log.stat().st_size
        time.sleep(0.4)
        assert log.stat().st_size == size, "a stopped tree printed nothing"
        freezer.continue_tree(stopped)
        end = time.monotonic() + 10.0  # a loaded machine may take a while to run them again
        while log.stat().st_size == size and time.monotonic() < end:
            time.sleep(0.05)
        assert log.stat().st_size > size
        assert {"child", "grandchild"} <= {line.split()[0] for line in log.read_text().splitlines() if line}
    finally:
        for pid in freezer.process_tree(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.wait()


BUSY_THREADS = """
import threading
def spin():
    while True:
        pass
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
print("spinning", flush=True)
spin()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux only")
def test_stop_tree_returns_once_every_busy_thread_has_stopped():
    """Five threads spinning on the CPU, more than this machine may have: SIGSTOP reaches each one
    when it next enters the kernel, and ``stop_tree`` waits for that."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY_THREADS], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == b"spinning"
        for _ in range(20):
            stopped = freezer.stop_tree(proc.pid)
            states = freezer.thread_states(proc.pid)
            assert len(states) == 5 and set(states) <= set("Tt"), states
            freezer.continue_tree(stopped)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_sign_of_a_context_is_the_unified_memory_device_not_the_gpu_node():
    """On the H200 a process that had only collected TileGym's tests mapped /dev/nvidia0 and
    /dev/nvidiactl with no context (nvidia-smi listed none); a tensor on the GPU added /dev/nvidia-uvm
    (``freezer``'s docstring)."""
    assert freezer.is_gpu_file("/dev/nvidia-uvm")
    assert not freezer.is_gpu_file("/dev/nvidia0") and not freezer.is_gpu_file("/dev/nvidiactl")
    assert not freezer.is_gpu_file("/dev/nvidia-uvm-tools") and not freezer.is_gpu_file("/dev/nvidia-caps/nvidia-cap1")


def test_a_mapped_path_with_a_space_is_read_whole():
    """``/proc/<pid>/maps`` puts the path after five fields, and a path may hold spaces: read at
    its last space, a device file under such a folder, or the driver's library, would be missed."""
    maps = ("7f00-7f10 rw-s 00000000 00:05 91 /dev/nvidia-uvm\n"
            "7f10-7f20 r-xp 00000000 08:01 42 /opt/my drivers/libcuda.so.1\n"
            "7f20-7f30 rw-p 00000000 00:00 0 \n"
            "7f30-7f40 r--p 00000000 08:01 43 /usr/lib/libfoo.so (deleted)\n")
    assert freezer.mapped_paths(maps) == ["/dev/nvidia-uvm", "/opt/my drivers/libcuda.so.1",
                                          "/usr/lib/libfoo.so (deleted)"]
    from cutile_perf.child import warmstart

    assert warmstart.driver_mapped(maps)


def test_the_drivers_list_names_a_process_that_maps_nothing(monkeypatch):
    assert freezer.parse_compute_pids("493\n 612\n\nNo running processes found\n") == {493, 612}
    monkeypatch.setattr(freezer, "gpu_files", lambda pid: [])
    assert freezer.gpu_holders({7, 8}, listed={8, 99}) == {8: ["a CUDA context (nvidia-smi)"]}
    assert freezer.gpu_holders({7, 8}, listed=None) == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux only")
def test_gpu_holders_reads_a_mapping_from_outside(tmp_path, monkeypatch):
    device = tmp_path / "fake-gpu-device"
    device.write_bytes(b"\0" * 4096)
    code = f"import mmap, time; f = open({str(device)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 4096); " \
           "print('mapped', flush=True); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "mapped"
        monkeypatch.setattr(freezer, "is_gpu_file", lambda path: path.endswith("/fake-gpu-device"))
        assert freezer.gpu_holders({proc.pid, os.getpid()}) == {proc.pid: [f"{device} mapped"]}
    finally:
        proc.kill()
        proc.wait()


# --- the loop ------------------------------------------------------------------------------------------


def _heads(runs, pattern: str) -> dict[str, str]:
    return {log.name: log.read_text().splitlines()[0] for log in sorted(runs.glob(pattern))}


@pytest.mark.xfail(reason="known failure since the issue-39 judge changes (new-baseline keeps need interleaved pairs): the re-check's start schedule differs; the child-pool rework (branch i40pool) replaces this mode", strict=False)
@pytest.mark.slow
@AHEAD
def test_recheck_runs_collected_ahead_run_the_cases_in_doubt_and_the_verdict_comes_as_before(
        tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "SPECULATIVE_MIN_CPUS", 1)
    repo = _slow_tests_session(tmp_path, collect_ahead=True)
    runs = repo / "sandbox" / "runs"
    heads = _heads(runs, "0-r*-perf.log")
    assert all("(collected ahead of its turn)" in heads[f"0-r{k}-perf.log"] for k in (2, 3)), heads
    edit_kernel(repo, latency={"256x1024": 2.0, "4096x1024": 4.0})
    call(repo, "try", "twice as slow: its perf run decides")
    assert rows(repo)[-1]["status"] == "revert" and not rows(repo)[-1].get("confirm"), rows(repo)[-1]
    assert not list(runs.glob("1-confirm*")), "the unused re-check runs left logs of runs that never happened"
    edit_kernel(repo, latency=BORDERLINE)
    code, data, _ = call(repo, "try", "one case 1 % slower: the re-check decides")
    row = rows(repo)[-1]
    assert row["status"] == "revert" and row["timings"]["recheck_runs"] == 6, row  # as in the other modes
    heads = _heads(runs, "2-confirm*-perf.log")
    assert len(heads) == 6 and all("(collected ahead of its turn)" in h for h in heads.values()), heads
    # Collected before its cases were known, each ran only the one in doubt (handed over at its gate).
    for name in heads:
        report = (runs / name).with_suffix(".report.jsonl")
        records = [json.loads(line) for line in report.read_text().splitlines()]
        shapes = {r["nodeid"].split("[")[1].split("-")[0] for r in records if r["type"] == "record"}
        assert shapes == {"256x1024"}, (name, shapes)


# The candidate's kernel module, at import (while it is collected ahead of its turn), starts a thread
# and a grandchild in a session of its own; both write the time into its perf log every 20 ms.
TICKING = TO_PERF_LOG + '''
import threading as _threading, time as _time
def _tick(_who):
    while True:
        _to_perf_log(f"\\nTICK {_who} {_time.time()!r}\\n")
        _time.sleep(0.02)
if _os.fork() == 0:
    _os.setsid()
    _tick("grandchild")
_threading.Thread(target=_tick, args=("thread",), daemon=True).start()
'''


def _timed_windows(monkeypatch) -> list[tuple[str, float, float]]:
    """``(tag, first test may start, run ended)`` in wall time for every perf run the loop times:
    from its tests gate's opening to the end of its stage."""
    windows: list[tuple[str, float, float]] = []
    opened: list[float] = []
    real_open, real_stage = runner.Gate.open, stages.StageRunner.stage

    def open_and_note(self, handover=b""):
        opened.append(time.time())
        return real_open(self, handover)

    def stage_and_note(self, name, tag, commit, cases=None, session=None, then=()):
        opened.clear()
        result = real_stage(self, name, tag, commit, cases, session, then)
        if name == "perf" and opened:
            windows.append((tag, opened[-1], time.time()))
        return result

    monkeypatch.setattr(runner.Gate, "open", open_and_note)
    monkeypatch.setattr(stages.StageRunner, "stage", stage_and_note)
    return windows


@pytest.mark.slow
@AHEAD
@pytest.mark.parametrize("stopped", [True, False], ids=["stopped", "not-stopped"])
def test_a_candidate_collected_ahead_does_nothing_while_the_baseline_is_timed(tmp_path, monkeypatch, stopped):
    """Red team. Collected ahead of its turn, the candidate's module has run (it imports at
    collection) and left a thread and a grandchild that escaped its process group, both working.
    Beside the baseline's timed runs of the re-check they could load the machine to slow the
    baseline down and make the candidate look faster in every pair. Its whole process tree is
    stopped while another run is timed: none of them writes a tick inside a baseline run's window.
    ``not-stopped`` shows what the test sees without the stop."""
    monkeypatch.setattr(stages, "SPECULATIVE_MIN_CPUS", 1)
    repo = _slow_tests_session(tmp_path, collect_ahead=True)
    edit_kernel(repo, latency=BORDERLINE)
    append_to_kernel(repo, TICKING)
    if not stopped:
        monkeypatch.setattr(stages.StageRunner, "_stop_collected", lambda self: None)
    windows = _timed_windows(monkeypatch)
    code, data, _ = call(repo, "try", "borderline, and its module leaves workers behind at import")
    assert rows(repo)[-1].get("confirm"), rows(repo)[-1]  # the re-check ran
    runs = repo / "sandbox" / "runs"
    ticks = [float(line.split()[2]) for log in runs.glob("1-*cand-perf.log")
             for line in log.read_text().splitlines() if line.startswith("TICK ")]
    assert ticks, "the candidate's workers never ran: nothing was tested"
    base = [(start, end) for tag, start, end in windows if tag.endswith("-base")]
    assert len(base) == 3, windows
    inside = [t for t in ticks for start, end in base if start < t < end]
    if stopped:
        assert not inside, f"{len(inside)} ticks of the candidate's workers inside the baseline's timed runs"
    else:
        assert len(inside) > 10, inside  # what the stop prevents


# The candidate's kernel module, at import, maps a file the test names a GPU device file: what a
# module that makes a CUDA context at import leaves in its process.
MAPS_A_DEVICE = '''
import mmap as _mmap, os as _os2
_dev = _os2.path.join(_os2.path.dirname(_os2.path.abspath(__file__)), "fake-gpu-device")
with open(_dev, "wb") as _f:
    _f.write(bytes(4096))
_dev_file = open(_dev, "r+b")
_DEVICE_MAP = _mmap.mmap(_dev_file.fileno(), 4096)
'''


@pytest.mark.slow
@AHEAD
def test_a_child_that_holds_the_gpu_before_its_turn_is_ended_and_the_rest_wait_before_collecting(
        tmp_path, monkeypatch, capsys):
    """Red team. A candidate whose module makes a CUDA context at import would hold it, collected
    ahead of its turn, beside the baseline's timed runs: work it queued before it was stopped would
    still run on the GPU. Such a child is ended (its run starts fresh in its turn), and the children
    started ahead after it wait before any code of the repository (``child.warmstart``)."""
    monkeypatch.setattr(stages, "SPECULATIVE_MIN_CPUS", 1)
    monkeypatch.setattr(freezer, "is_gpu_file", lambda path: path.endswith("/fake-gpu-device"))
    repo = _slow_tests_session(tmp_path, collect_ahead=True)
    edit_kernel(repo, latency=BORDERLINE)
    append_to_kernel(repo, MAPS_A_DEVICE)
    code, data, _ = call(repo, "try", "borderline, and its module maps the GPU at import")
    row = rows(repo)[-1]
    assert row["status"] == "revert" and row["timings"]["recheck_runs"] == 6, row  # the verdict as before
    err = capsys.readouterr().err
    assert "held the GPU before its turn (" in err and "fake-gpu-device mapped" in err, err
    heads = _heads(repo / "sandbox" / "runs", "1-confirm*-perf.log")
    assert any("(collected ahead of its turn)" not in h for h in heads.values()), heads
    assert "fake-gpu-device mapped" in row["collect_ahead_refused"], row
    # The next try believes the row: its children start ahead without collecting, so none is
    # ended to learn it again.
    edit_kernel(repo, latency=BORDERLINE)
    call(repo, "try", "borderline again, its module as the baseline's")
    assert rows(repo)[-1]["timings"]["recheck_runs"] == 6, rows(repo)[-1]
    assert "held the GPU" not in capsys.readouterr().err
    heads = _heads(repo / "sandbox" / "runs", "2-confirm*-perf.log")
    assert len(heads) == 6 and not any("(collected ahead of its turn)" in h for h in heads.values()), heads
    assert "collect_ahead_refused" not in rows(repo)[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux only")
def test_a_killed_child_counts_as_gone_once_it_has_exited_not_when_it_was_signalled(monkeypatch):
    """Its CUDA context, and any work it queued, ends with its exit, so the next timed run waits
    for that; a zombie has exited already."""
    monkeypatch.setattr(freezer, "compute_pids", lambda: None)  # no driver here
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "lambda *a: (time.sleep(0.5), exit(0))); print('up', flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    proc.terminate()  # it takes half a second to exit
    assert not freezer.wait_gone({proc.pid}, timeout_s=0.1)
    assert freezer.wait_gone({proc.pid}, timeout_s=10.0)  # gone before it was reaped: a zombie
    proc.wait()
    monkeypatch.setattr(freezer, "compute_pids", lambda: {proc.pid})  # still listed by the driver
    assert not freezer.wait_gone({proc.pid}, timeout_s=0.1)
