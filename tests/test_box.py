"""Children in a box (issue 19, item 1): the test children run in ``child/box.py``'s sandbox.

The red-team tests mount each attack on the simulated TileGym-shaped repository (tests/fixtures_repo.py)
through the real CLI, as ``tests/test_redteam.py`` does: code appended to the kernel runs inside
every pytest child at import. Each attack FAILS its test when the children run unboxed
(run them with ``CUTILE_PERF_SANDBOX=off`` to watch each attack land) and passes in the box; the harness's other defences (the tamper
check, the process group) are what ``test_redteam.py`` tests, unboxed.

Linux only; the red-team tests skip, with the reason, where ``box.available()`` says no box can be
had (unprivileged user namespaces disabled, no ``unshare``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import site
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from fixtures_repo import KERNEL_REL, edit_kernel, git
from redteam_helpers import (SLOW, _template, append_to_kernel, assert_not_kept_nothing_lost, call, repo,  # noqa: F401
                             rows, snapshot)

from cutile_perf import knobs
from cutile_perf.child import groups as groups_mod
from cutile_perf.child import box, boxinit, runner

WHY_NOT = box.available() if sys.platform.startswith("linux") else "not Linux"
# The attacks here read the harness's environment or its files on purpose: try's static probe scan
# would refuse them before they run; these tests are about the box behind it.
pytestmark = pytest.mark.usefixtures("runtime_defences_only")

needs_box = pytest.mark.skipif(WHY_NOT is not None, reason=f"no sandbox here: {WHY_NOT}")


# --- the mount plan (pure) ------------------------------------------------------------------------

SPEC = {
    "binds": [["/tmp/cutile-perf-checkouts-0/abc/slot-0", box.CHECKOUT], ["/tmp/cutile-perf-run-x", box.RUN],
              ["/home/u/repo/sandbox/jit-cache", box.CACHE]],
    "hide": ["/home/u/repo", "/tmp", "/home/u/repo/sandbox"],
    "reveal": ["/home/u/repo/.venv", "/usr/lib/python3.11"],
    "cwd": box.CHECKOUT,
}

MOUNTINFO = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
22 27 0:21 / /proc rw,relatime - proc proc rw
60 22 0:40 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
23 27 0:22 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,nosuid,relatime - devtmpfs devtmpfs rw
25 24 0:23 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw
28 27 0:25 / /opt/with\\040space ro,nosuid,nodev,noatime - tmpfs t ro
61 27 0:41 / /tmp rw,nosuid,nodev,relatime - tmpfs tmpfs rw
62 27 0:42 / /home/u/repo rw,nosuid,nodev,relatime - tmpfs tmpfs rw
63 62 254:0 /home/u/repo/.venv /home/u/repo/.venv rw,relatime - ext4 /dev/vda rw
64 61 254:0 /x /tmp/cutile-perf-box/checkout rw,relatime - ext4 /dev/vda rw
65 61 254:0 /y /tmp/cutile-perf-box/run rw,relatime - ext4 /dev/vda rw
66 61 254:0 /z /tmp/cutile-perf-box/jit-cache rw,relatime - ext4 /dev/vda rw
"""


def test_box_plan_binds_from_descriptors_hides_then_remounts_everything_else_read_only():
    devices = boxinit.device_names(["vda", "kvm", "null", "nvidia0", "nvidia-caps", "tty", "loop0", "shm"])
    assert devices == ["null", "nvidia-caps", "nvidia0", "tty"]  # only what a child needs
    plan = [*boxinit.setup_plan(SPEC, devices),
            *(("remount-ro", point, flags) for point, flags in boxinit.remount_plan(SPEC, MOUNTINFO))]
    setup = [op for op in plan if op[0] != "remount-ro"]
    assert setup == [
        ("private", "/"),
        # Descriptors first: every bind source may lie under a path about to be hidden.
        ("open", "/home/u/repo/.venv"),
        ("open", "/tmp/cutile-perf-checkouts-0/abc/slot-0"), ("open", "/tmp/cutile-perf-run-x"),
        ("open", "/home/u/repo/sandbox/jit-cache"),
        ("open", "/dev/null"), ("open", "/dev/nvidia-caps"), ("open", "/dev/nvidia0"), ("open", "/dev/tty"),
        # /tmp always (the box paths live there); sandbox/ is inside the repo: one tmpfs covers both.
        ("tmpfs", "/tmp"), ("tmpfs", "/home/u/repo"),
        # Only what a hidden path covers comes back (/usr/lib is visible anyway), read-only below.
        ("mkdirs", "/home/u/repo/.venv"), ("bind", "/home/u/repo/.venv", "/home/u/repo/.venv"),
        ("mkdirs", box.CHECKOUT), ("bind", "/tmp/cutile-perf-checkouts-0/abc/slot-0", box.CHECKOUT),
        ("mkdirs", box.RUN), ("bind", "/tmp/cutile-perf-run-x", box.RUN),
        ("mkdirs", box.CACHE), ("bind", "/home/u/repo/sandbox/jit-cache", box.CACHE),
        # A /dev of the box's own, with the host's nodes bound in one by one.
        ("tmpfs", "/dev"),
        ("stub", "/dev/null", "/dev/null"), ("bind", "/dev/null", "/dev/null"),
        ("stub", "/dev/nvidia-caps", "/dev/nvidia-caps"), ("bind", "/dev/nvidia-caps", "/dev/nvidia-caps"),
        ("stub", "/dev/nvidia0", "/dev/nvidia0"), ("bind", "/dev/nvidia0", "/dev/nvidia0"),
        ("stub", "/dev/tty", "/dev/tty"), ("bind", "/dev/tty", "/dev/tty"),
        ("symlink", "/proc/self/fd", "/dev/fd"), ("symlink", "/proc/self/fd/0", "/dev/stdin"),
        ("symlink", "/proc/self/fd/1", "/dev/stdout"), ("symlink", "/proc/self/fd/2", "/dev/stderr"),
        ("symlink", "pts/ptmx", "/dev/ptmx"),
        ("mkdirs", "/dev/shm"), ("tmpfs", "/dev/shm"), ("mkdirs", "/dev/pts"), ("devpts", "/dev/pts"),
    ]
    remounts = {op[1]: op[2] for op in plan if op[0] == "remount-ro"}
    # Every mount but /proc, the writable binds, /dev/shm and /dev/pts: the hiding tmpfs and /dev
    # (the box's own, with its nodes) included.
    assert sorted(remounts) == ["/", "/dev", "/home/u/repo", "/home/u/repo/.venv", "/opt/with space", "/sys", "/tmp"]
    base = boxinit.MS_BIND | boxinit.MS_REMOUNT | boxinit.MS_RDONLY
    assert remounts["/"] == base | boxinit.MS_RELATIME
    # The flags a user namespace may not drop are kept, or the remount is refused.
    assert remounts["/sys"] == base | boxinit.MS_NOSUID | boxinit.MS_NODEV | boxinit.MS_NOEXEC | boxinit.MS_RELATIME
    assert remounts["/opt/with space"] == base | boxinit.MS_NOSUID | boxinit.MS_NODEV | boxinit.MS_NOATIME


def test_paths_are_rewritten_to_the_fixed_box_paths_and_back():
    b = box.Box(binds=(("/tmp/slots/slot-1", box.CHECKOUT), ("/tmp/run-abc", box.RUN)), hide=("/repo",))
    env = b.env({"PYTHONPATH": "/tmp/slots/slot-1/src:/tmp/slots/slot-1:/opt/lib",
                 "CUTILE_PERF_REPORT": "/tmp/run-abc/report.jsonl", "OTHER": "/tmp/slots/slot-10"})
    assert env["PYTHONPATH"] == f"{box.CHECKOUT}/src:{box.CHECKOUT}:/opt/lib"
    assert env["CUTILE_PERF_REPORT"] == f"{box.RUN}/report.jsonl"
    assert env["OTHER"] == "/tmp/slots/slot-10"  # a prefix of the name is not the folder
    assert {env[k] for k in ("HOME", "TMPDIR", "TMP", "TEMP")} == {box.SCRATCH}
    assert b.to_host(f"{box.CHECKOUT}/src/k.py") == "/tmp/slots/slot-1/src/k.py"
    assert b.to_host("/usr/lib/x.py") == "/usr/lib/x.py"
    # The same stage in another slot or another command sees the same paths: try and verify look alike.
    other = box.Box(binds=(("/tmp/verify-xyz/slot", box.CHECKOUT), ("/tmp/run-def", box.RUN)), hide=("/repo",))
    assert other.spec("/tmp/verify-xyz/slot")["cwd"] == b.spec("/tmp/slots/slot-1")["cwd"] == box.CHECKOUT


def test_the_environment_is_an_allow_list(monkeypatch):
    for name, value in {"PYTEST_ADDOPTS": "-p evil", "PYTEST_PLUGINS": "evil", "LD_PRELOAD": "/x.so",
                        "PYTHONSTARTUP": "/x.py", "GITHUB_TOKEN": "t", "CUDA_TILE_CACHE_DIR": "/users/cache",
                        "CUDA_VISIBLE_DEVICES": "1", "LC_ALL": "C.UTF-8", "NVIDIA_VISIBLE_DEVICES": "all",
                        "PATH": "/usr/bin"}.items():
        monkeypatch.setenv(name, value)
    env = knobs.allowed_child_env(CUTILE_PERF_REPORT="/r")
    assert {"PYTEST_ADDOPTS", "PYTEST_PLUGINS", "LD_PRELOAD", "PYTHONSTARTUP", "GITHUB_TOKEN",
            "CUDA_TILE_CACHE_DIR"}.isdisjoint(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["LC_ALL"] == "C.UTF-8" and env["PATH"] == "/usr/bin"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["CUTILE_PERF_REPORT"] == "/r"


def test_no_box_is_never_silent(monkeypatch):
    monkeypatch.setenv("CUTILE_PERF_SANDBOX", "off")
    assert box.label(box.decide("auto")) == "none: off (CUTILE_PERF_SANDBOX=off)"
    monkeypatch.delenv("CUTILE_PERF_SANDBOX")
    assert box.label(box.decide("off")) == "none: off (session.yaml sandbox: off)"
    assert box.label(box.decide("auto")) == ("unshare" if WHY_NOT is None else f"none: {WHY_NOT}")
    monkeypatch.setenv("CUTILE_PERF_SANDBOX", "of")
    with pytest.raises(Exception, match="CUTILE_PERF_SANDBOX"):
        box.decide("auto")


def test_a_signal_death_in_the_box_reads_as_one_outside():
    assert box.returncode(128 + signal.SIGSEGV) == -signal.SIGSEGV
    assert (box.returncode(0), box.returncode(1), box.returncode(None)) == (0, 1, None)


# --- the box itself, without the loop ---------------------------------------------------------------


def _in_box(tmp_path: Path, code: str, timeout_s: float = 30, **kwargs) -> tuple[runner.RunResult, str]:
    checkout, private = tmp_path / "checkout", tmp_path / "private"
    checkout.mkdir(exist_ok=True)
    private.mkdir(exist_ok=True)
    b = box.for_stage(tmp_path / "repo", checkout, private, None)
    result = runner.run([sys.executable, "-c", code], cwd=checkout, timeout_s=timeout_s,
                        output_path=tmp_path / "out.log", box=b, **kwargs)
    return result, result.tail()


@needs_box
def test_the_box_cannot_be_taken_apart_from_inside(tmp_path):
    """Root in the box's user namespace, but without capabilities: no remount, no unmount."""
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("remount", libc.mount(None, b"/", None, 0x1000 | 0x20, None))
print("umount", libc.umount2(b"/tmp", 2))
print("uid", os.getuid(), "pid", os.getpid(), "cwd", os.getcwd())
print("tmp", sorted(os.listdir("/tmp")))
"""
    # The host's /tmp is hidden by a fresh tmpfs: a file made there now is not seen. The box's /tmp
    # may hold more than cutile-perf-box (the clone or venv bound in where they live, under /tmp
    # too on a fresh machine), so only the marker's absence is asserted (issue 43).
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="host-only-") as marker:
        result, out = _in_box(tmp_path, code)
    assert result.returncode == 0, out
    assert "remount -1" in out and "umount -1" in out, out
    assert f"pid 2 cwd {box.CHECKOUT}" in out, out  # its own pid namespace, the fixed checkout path
    listing = next(line for line in out.splitlines() if line.startswith("tmp ["))
    assert "'cutile-perf-box'" in listing and Path(marker.name).name not in listing, out


@needs_box
def test_the_gpu_device_nodes_stay_usable(tmp_path):
    """The nodes bound into the box's /dev work: a node that opens outside opens inside
    (/dev/nvidia* on a GPU host)."""
    nodes = [p for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/null") if os.access(p, os.R_OK | os.W_OK)]
    result, out = _in_box(tmp_path, f"import os\nfor p in {nodes!r}:\n    os.close(os.open(p, os.O_RDWR))\n")
    assert result.returncode == 0, out


@needs_box
def test_timeout_and_the_process_group_still_end_the_boxed_child(tmp_path):
    groups: list[int] = []
    start = time.monotonic()
    result, out = _in_box(tmp_path, "import time\ntime.sleep(60)\n", timeout_s=1.5, on_start=groups.append)
    assert result.timed_out and time.monotonic() - start < 10, out
    assert groups and groups_mod.live_members(groups[0]) == 0


# --- red team through the loop ------------------------------------------------------------------------


def _attack(repo: Path, name: str, code: str) -> None:
    """A 50 % slower kernel (reverted on its merits) with attack code appended; the attack never
    breaks the import (it is silent), so whatever it achieves is all that differs from a revert."""
    edit_kernel(repo, latency=SLOW)
    body = "\n".join("    " + line for line in code.strip("\n").splitlines())
    append_to_kernel(repo, f"# ATTACK {name}\ntry:\n{body}\nexcept Exception:\n    pass\n")


def _try(repo: Path, what: str) -> tuple[int, dict]:
    code, data, _ = call(repo, "try", what)
    return code, data


def _assert_boxed(repo: Path) -> None:
    if knobs.sandbox_override() == "off":  # CUTILE_PERF_SANDBOX=off: watch the attacks land
        return
    logs = sorted((repo / "sandbox/runs").glob("*-correctness.log"), key=lambda p: p.stat().st_mtime)
    assert logs and "(in the sandbox)" in logs[-1].read_text().splitlines()[0], "the child did not run in the box"


@needs_box
def test_a_kernel_cannot_write_the_users_repository_or_its_git(repo, tmp_path):
    """(a) A file planted in the work tree, core.fsmonitor (run by the harness's next git call) and
    a new branch ref: none of them lands."""
    fsmonitor_ran = tmp_path / "fsmonitor-ran"
    config = (repo / ".git/config").read_bytes()
    before = snapshot(repo)
    _attack(repo, "write-repo", f"""
import pathlib, subprocess
_r = pathlib.Path(__REPO__)
(_r / "planted.py").write_text("print('planted')\\n")
with (_r / ".git/config").open("a") as _fh:
    _fh.write("[core]\\n\\tfsmonitor = \\"touch {fsmonitor_ran}; false\\"\\n")
_head = subprocess.run(["git", "-C", str(_r), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
(_r / ".git/refs/heads/attacker").write_text((_head or "0" * 40) + "\\n")
""")
    code, data = _try(repo, "slower (write the repository)")
    _assert_boxed(repo)
    assert not (repo / "planted.py").exists()
    assert (repo / ".git/config").read_bytes() == config
    assert "refs/heads/attacker" not in git(repo, "for-each-ref")
    git(repo, "status", "--porcelain")  # the next git command: an fsmonitor would run now
    assert not fsmonitor_ran.exists()
    assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK write-repo")


@needs_box
def test_a_kernel_cannot_touch_the_session_log_now_or_after_it_ends(repo):
    """(b) Append a forged row to sandbox/experiments.jsonl at import, and again from a process
    that waits for the stage to end (after the harness compared the log)."""
    forged = '{"iteration": 0, "status": "keep", "latency_ms": 100.0}'
    before = snapshot(repo)
    _attack(repo, "append-log", f"""
import os, subprocess, sys
_log = os.path.join(__REPO__, "sandbox", "experiments.jsonl")
with open(_log, "a") as _fh:
    _fh.write({forged!r} + "\\n")
subprocess.Popen(["setsid", sys.executable, "-c",
                  "import time; time.sleep(2); open(%r, 'a').write(%r + '\\\\n')" % (_log, {forged!r})],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
""")
    code, data = _try(repo, "slower (append to the log)")
    _assert_boxed(repo)
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK append-log")
    assert row["status"] == "revert" and row.get("crash_class") is None, row  # no tampering to catch
    time.sleep(3)
    assert call(repo, "status")[0] == 0
    assert len(rows(repo)) == before.rows + 1 and all("latency_ms" not in r or r["latency_ms"] != 100.0
                                                     for r in rows(repo))


@needs_box
def test_a_kernel_cannot_plant_a_pth_file_in_site_packages(repo):
    """(c) A .pth file in site-packages runs in every later Python process of the machine."""
    name = f"cutile_perf_redteam_{uuid.uuid4().hex}.pth"
    dirs = [Path(d) for d in {*site.getsitepackages(), site.getusersitepackages()}]
    before = snapshot(repo)
    _attack(repo, "pth", f"""
import site
for _d in [*site.getsitepackages(), site.getusersitepackages()]:
    try:
        with open(_d + "/{name}", "w") as _fh:
            _fh.write("# inert: cutile-perf red-team test\\n")
    except OSError:
        pass
""")
    try:
        code, data = _try(repo, "slower (plant a .pth)")
        _assert_boxed(repo)
        planted = [str(d / name) for d in dirs if (d / name).exists()]
        assert not planted, f"planted: {planted}"
        assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK pth")
    finally:
        for d in dirs:
            with contextlib.suppress(OSError):
                (d / name).unlink()


def _pids_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "status").read_text()
        except OSError:
            continue
        if token in cmdline and "State:\tZ" not in state:
            found.append(int(entry.name))
    return found


@needs_box
def test_a_daemon_started_by_the_kernel_dies_with_the_stage(repo):
    """(d) A ``setsid`` daemon leaves the child's process group, so the group kill misses it."""
    token = f"redteam-daemon-{uuid.uuid4().hex}"
    before = snapshot(repo)
    _attack(repo, "daemon", f"""
import subprocess, sys
subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(120)  # {token}"],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
""")
    try:
        code, data = _try(repo, "slower (leave a daemon)")
        _assert_boxed(repo)
        end = time.monotonic() + 5
        while _pids_with(token) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _pids_with(token), "a daemon the kernel started is still running"
        assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK daemon")
    finally:
        for pid in _pids_with(token):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@needs_box
def test_the_users_environment_does_not_reach_the_kernel(repo, monkeypatch):
    """(e) What the harness's user set is not in the child's environment: here the kernel makes
    itself 'faster' when it can read it. (A variable that shapes measurements, PYTEST_ADDOPTS say,
    set after the baseline is refused before anything runs: tests/test_iteration.py.)"""
    token = uuid.uuid4().hex
    monkeypatch.setenv("REDTEAM_SECRET", token)
    before = snapshot(repo)
    _attack(repo, "env", f"""
import os
if "{token}" in os.environ.get("REDTEAM_SECRET", ""):
    LATENCY_MS = {{s: v / 2 for s, v in LATENCY_MS.items()}}
""")
    code, data = _try(repo, "slower (read the user's environment)")
    _assert_boxed(repo)
    assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK env")


@needs_box
def test_the_kernel_has_no_network(repo):
    """(f) A connection to a socket listening on the host's 127.0.0.1."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    connections: list[str] = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _addr = server.accept()
            except OSError:
                continue
            with conn:
                connections.append(conn.recv(64).decode(errors="replace"))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    before = snapshot(repo)
    _attack(repo, "network", f"""
import socket
with socket.create_connection(("127.0.0.1", {port}), timeout=2) as _s:
    _s.sendall(b"hello from the kernel")
""")
    try:
        code, data = _try(repo, "slower (call home)")
        _assert_boxed(repo)
        time.sleep(0.5)
        assert connections == [], f"the kernel reached the host's network: {connections}"
        assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK network")
    finally:
        stop.set()
        thread.join(timeout=2)
        server.close()


@needs_box
def test_try_and_verify_children_see_the_same_fixed_checkout_path(repo):
    """Item 4: whichever slot or command (try, verify) a child runs in, its kernel file has one
    path, so it cannot tell them apart by place, and cuTile's cache key (which embeds that path)
    is the same for every slot. The signed run reports keep the paths the children saw."""
    edit_kernel(repo, latency={s: v / 2 for s, v in SLOW.items()})  # 25 % faster than the baseline
    code, data = _try(repo, "faster")
    assert code == 0, data
    code, data, _ = call(repo, "verify")
    assert data.get("verified") is not None, data
    seen: dict[str, set[str]] = {}
    for report in (repo / "sandbox/runs").glob("*.report.jsonl"):
        for line in report.read_text().splitlines():
            files = json.loads(line).get("files") if '"modules"' in line else None
            for name, path in (files or {}).items():
                if name == "fakegym.ops.cutile.rms_norm":
                    seen.setdefault(path, set()).add(report.name.split("-")[0])
    assert set(seen) == {f"{box.CHECKOUT}/{KERNEL_REL}"}, seen
    assert {"verify"} <= set().union(*seen.values()), seen  # verify's children too, not only try's


# --- the overhead, for the record ---------------------------------------------------------------------


@needs_box
def test_the_box_costs_little_per_child(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "box_overhead", Path(__file__).resolve().parents[1] / "benchmarks" / "box_overhead.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # the benchmark's own measurement, run small
    plain, boxed = bench.startup_cost(runs=5)
    print(f"python -c pass: {plain * 1e3:.1f} ms unboxed, {boxed * 1e3:.1f} ms boxed")
    assert boxed - plain < 2.0  # generous: a shared CI machine; the figure is in the final report
