"""The box is closed for root too (issue 44, items 1 and 5): each hole a child in the box found
open is a test here that fails without its defence in ``child/box.py`` and ``child/boxinit.py``.

- The host's ``/dev``: the box used to leave it as it is, and a child that is root on the host
  could add, rename and delete its entries (a folder in place of ``/dev/null`` breaks every
  process of the machine). The box now has a ``/dev`` of its own, read-only, with only the nodes a
  child needs bound in.
- System V IPC: a child's shared-memory segment outlived it (and the session), and a later child
  could read it. The box now has its own IPC namespace.
- A test interpreter the box hides (a venv under ``/tmp``) ran without its environment and the
  row said only "No module named pytest"; the box now says so in one line with the fix.

CI runs as root, the case that matters (GPU containers run as root); the non-root box is checked
against the root one where this machine lets an unprivileged user make namespaces. Everything
skips, with the reason, where no box can be had.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from cutile_perf.child import box, boxinit, runner
from cutile_perf.child.measure import _last_lines

WHY_NOT = box.available() if sys.platform.startswith("linux") else "not Linux"
needs_box = pytest.mark.skipif(WHY_NOT is not None, reason=f"no sandbox here: {WHY_NOT}")
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="only root can change the host's /dev (CI runs as root)")

IPC_CREAT = 0o1000
IPC_RMID = 0
# What a child may see in its /dev: the nodes bound in, their links, its own shm and pts.
ALLOWED_DEV = {*boxinit.DEV_NODES, *(name for name, _target in boxinit.DEV_LINKS), "shm", "pts"}


def _in_box(tmp_path: Path, code: str, timeout_s: float = 60) -> tuple[runner.RunResult, str]:
    """Run ``python -c code`` as a test child in its box, through the runner."""
    checkout, private = tmp_path / "checkout", tmp_path / "private"
    checkout.mkdir(exist_ok=True)
    private.mkdir(exist_ok=True)
    the_box = box.for_stage(tmp_path / "repo", checkout, private, None)
    log = tmp_path / f"out-{uuid.uuid4().hex[:8]}.log"
    result = runner.run([sys.executable, "-c", code], cwd=checkout, timeout_s=timeout_s, output_path=log,
                        box=the_box)
    return result, result.tail()


def _report(out: str) -> dict:
    """The JSON line a child printed last."""
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"the child printed no report:\n{out}")


# --- the host's /dev --------------------------------------------------------------------------------


@needs_box
@needs_root
def test_a_root_child_cannot_add_rename_or_delete_entries_of_the_hosts_dev(tmp_path):
    """As root, the child tries what broke a session: a new folder in /dev, a node renamed away and
    a folder put in its place (on a null-like probe node of the test's own: never the real
    /dev/null, which an open box would let it move on the host), a chmod of /dev/null (to the
    mode it has: harmless where it lands). The host's
    /dev must be unchanged, and the child's /dev must hold only what a child needs, working."""
    tag = uuid.uuid4().hex[:12]
    probe, planted = f"/dev/cutile-perf-probe-{tag}", f"/dev/cutile-perf-planted-{tag}"
    os.mknod(probe, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a second /dev/null
    code = f"""
import json, os, stat
tried = {{}}
def attempt(name, action):
    try:
        action()
        tried[name] = "done"
    except OSError as exc:
        tried[name] = exc.strerror
attempt("mkdir", lambda: os.mkdir({planted!r}))
attempt("rename", lambda: os.rename({probe!r}, {probe!r} + "-moved"))
attempt("folder-in-its-place", lambda: os.mkdir({probe!r}))
attempt("unlink", lambda: os.unlink({probe!r}))
attempt("chmod-null", lambda: os.chmod("/dev/null", 0o666))
fd = os.open("/dev/null", os.O_RDWR)
os.write(fd, b"works")
os.close(fd)
print(json.dumps({{"tried": tried, "dev": sorted(os.listdir("/dev")),
                  "null_is_a_device": stat.S_ISCHR(os.stat("/dev/null").st_mode),
                  "urandom": len(open("/dev/urandom", "rb").read(16))}}))
"""
    try:
        result, out = _in_box(tmp_path, code)
        assert result.returncode == 0, out
        seen = _report(out)
        # The host's /dev: unchanged.
        assert stat.S_ISCHR(os.lstat(probe).st_mode), f"the probe node was replaced: {seen}"
        assert not os.path.lexists(planted) and not os.path.lexists(probe + "-moved"), seen
        assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
        # Nothing of it succeeded inside either (the box's /dev is read-only), and it showed only
        # what a child needs: no probe, no disk, no kvm.
        assert "done" not in seen["tried"].values(), seen["tried"]
        extra = {n for n in seen["dev"] if n not in ALLOWED_DEV and not n.startswith(boxinit.DEV_PREFIXES)}
        assert not extra, f"the box shows more of the host's /dev than a child needs: {sorted(extra)}"
        assert seen["null_is_a_device"] and seen["urandom"] == 16
    finally:
        for path in (planted, probe + "-moved", probe):
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.unlink(path)


@needs_box
def test_the_childs_dev_shm_and_dev_pts_are_its_own(tmp_path):
    """The writable parts of the box's /dev are private: a file in /dev/shm never reaches the
    host's, and a pseudo-terminal opens (on the box's own /dev/pts). Passes without this issue's
    change too: it pins that the private /dev keeps what a child had."""
    name = f"cutile-perf-shm-{uuid.uuid4().hex[:12]}"
    code = f"""
import json, os
open("/dev/shm/{name}", "w").write("x")
primary, secondary = os.openpty()
print(json.dumps({{"tty": os.ttyname(secondary)}}))
"""
    try:
        result, out = _in_box(tmp_path, code)
        assert result.returncode == 0, out
        assert _report(out)["tty"].startswith("/dev/pts/")
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


# --- System V IPC -------------------------------------------------------------------------------------


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
    libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return libc


def _host_segments() -> dict[int, int]:
    """``{key: shmid}`` of the host's System V shared-memory segments (``/proc/sysvipc/shm``)."""
    out = {}
    for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 1:
            out[int(fields[0])] = int(fields[1])
    return out


def _remove_segment(key: int) -> None:
    shmid = _host_segments().get(key)
    if shmid is not None:
        _libc().shmctl(shmid, IPC_RMID, None)


SHM_CHILD = """
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
find, make = {find}, {make}
seen = {{"found": libc.shmget(find, 0, 0)}}
if make:
    seen["made"] = libc.shmget(make, 1 << 20, 0o1000 | 0o600)  # IPC_CREAT; never removed
print(json.dumps(seen))
"""


@needs_box
@pytest.mark.skipif(not Path("/proc/sysvipc/shm").exists(), reason="no /proc/sysvipc/shm to read")
def test_a_sysv_segment_made_in_the_box_dies_with_it_and_no_box_sees_another(tmp_path):
    """A child makes a 1 MB segment and leaves it: the host never sees it and a later child cannot
    find it; a segment of the host's is invisible to the child."""
    host_key, child_key = (int(uuid.uuid4().hex[:7], 16) + 1 for _ in range(2))
    libc = _libc()
    try:
        assert libc.shmget(host_key, 4096, IPC_CREAT | 0o600) >= 0, os.strerror(ctypes.get_errno())
        result, out = _in_box(tmp_path, SHM_CHILD.format(find=host_key, make=child_key))
        assert result.returncode == 0, out
        first = _report(out)
        assert first["made"] >= 0, out  # the child could make its segment...
        assert first["found"] == -1, "the child found a segment of the host's"
        assert child_key not in _host_segments(), "the child's segment outlived it on the host"
        result, out = _in_box(tmp_path, SHM_CHILD.format(find=child_key, make=0))
        assert result.returncode == 0, out
        assert _report(out)["found"] == -1, "a later child found an earlier child's segment"
    finally:
        _remove_segment(host_key)
        _remove_segment(child_key)


# --- root and non-root alike --------------------------------------------------------------------------


AS_A_USER = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


def _unprivileged_python() -> str | None:
    """An interpreter that a user who is not root can run in a user namespace, with boxinit.py
    (this one may live under /root)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and os.path.exists(candidate):
            done = subprocess.run([*AS_A_USER, shutil.which("unshare") or "unshare", "--user", "--map-root-user",
                                   candidate, "-I", "-S", "-c", f"open({boxinit.__file__!r}).close()"],
                                  capture_output=True, check=False)
            if done.returncode == 0:
                return candidate
    return None


@needs_box
@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv (util-linux) to drop to a plain user")
def test_a_child_of_a_user_who_is_not_root_gets_the_same_closed_box(tmp_path):
    python = _unprivileged_python()
    if python is None:
        pytest.skip("no interpreter here that uid 65534 can run with boxinit.py in a user namespace")
    code = ("import ctypes, json, os; libc = ctypes.CDLL(None, use_errno=True); "
            "print(json.dumps({'dev': sorted(os.listdir('/dev')), 'found': libc.shmget(%d, 0, 0)}))")
    host_key = int(uuid.uuid4().hex[:7], 16) + 1
    libc = _libc()
    seen = {}
    try:
        assert libc.shmget(host_key, 4096, IPC_CREAT | 0o666) >= 0
        for who, prefix in (("root", ()), ("user", AS_A_USER)):
            argv = [*prefix, shutil.which("unshare"), *box.UNSHARE_FLAGS, python, "-I", "-S", boxinit.__file__,
                    json.dumps(box.Box((), ()).spec("/")), "--", python, "-I", "-S", "-c", code % host_key]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/", check=False)
            assert done.returncode == 0, done.stderr
            seen[who] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        _remove_segment(host_key)
    assert seen["user"] == seen["root"], seen
    assert seen["user"]["found"] == -1 and "shm" in seen["user"]["dev"]


# --- an interpreter the box hides -----------------------------------------------------------------------


def _fake_venv(root: Path) -> Path:
    """A venv's shape (``pyvenv.cfg`` beside ``bin``) whose python is this interpreter."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {os.path.dirname(sys.executable)}\n")
    (venv / "bin/python").symlink_to(sys.executable)
    (venv / "bin/pytest").write_text(f"#!{venv}/bin/python\nimport pytest\n")
    (venv / "bin/pytest").chmod(0o755)
    return venv


def test_an_interpreter_whose_environment_the_box_hides_is_named_with_the_fix(tmp_path):
    venv = _fake_venv(tmp_path / "hidden")
    bin_dir = str(venv / "bin")
    # Its bin on PATH comes back (box.make reveals PATH folders), its environment does not.
    hiding = box.Box(binds=(), hide=(str(tmp_path / "hidden"),), reveal=(bin_dir,))
    for command in ("python", f"{bin_dir}/python", "pytest"):  # found on PATH, by path, through #!
        line = box.hidden_interpreter(command, hiding, search_path=f"{bin_dir}:/usr/bin")
        assert line is not None, command
        assert str(venv) in line and f"{bin_dir}/python" in line, line
        root = next(h for h in boxinit.hidden_roots({"hide": hiding.hide}) if str(venv).startswith(h))
        assert f"install that environment outside {root}," in line and "CUTILE_PERF_SANDBOX=off" in line, line
        assert "\n" not in line
    showing = box.Box(binds=(), hide=(str(tmp_path / "hidden"),), reveal=(str(venv),))
    assert box.hidden_interpreter("python", showing, search_path=f"{bin_dir}:/usr/bin") is None
    assert box.hidden_interpreter(sys.executable, box.make([], hide=[tempfile.gettempdir()]), os.defpath) is None
    assert box.hidden_interpreter("no-such-command-anywhere", hiding, search_path=bin_dir) is None


@needs_box
def test_a_test_interpreter_under_tmp_gets_one_line_with_the_fix_not_no_module_named_pytest(tmp_path, monkeypatch):
    """Through the runner, as a stage runs its child: a venv in the temp folder (hidden by the box),
    its bin first on PATH (the box shows PATH folders, so its python starts, without its
    environment). The row's detail is the box's one line; the command never ran."""
    root = Path(tempfile.mkdtemp(prefix="cutile-perf-hidden-venv-"))
    try:
        venv = _fake_venv(root)
        monkeypatch.setenv("PATH", f"{venv}/bin{os.pathsep}{os.environ.get('PATH', os.defpath)}")
        checkout, private = tmp_path / "checkout", tmp_path / "private"
        checkout.mkdir()
        private.mkdir()
        the_box = box.for_stage(tmp_path / "repo", checkout, private, None)
        result = runner.run(["python", "-m", "pytest", "--version"], cwd=checkout, timeout_s=60,
                            output_path=tmp_path / "out.log", box=the_box)
        out = result.tail()
        assert result.returncode == box.SETUP_FAILED, out
        assert "No module named" not in out, out
        detail = _last_lines(out)  # what the row says (measure.run_stage)
        assert detail.startswith("cutile-perf box: Error: the sandbox hides"), detail
        assert str(venv) in detail and "install that environment outside" in detail, detail
        assert runner.classify(result) is not None
    finally:
        shutil.rmtree(root, ignore_errors=True)
