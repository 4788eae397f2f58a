"""The first code that runs inside a child's box (``child/box.py``): set up the mounts, drop the
privileges that could undo them, then run the command as the box's only child and wait for it.

Run by ``box.wrap`` as ``python -I -S boxinit.py <spec json> -- <argv>`` inside fresh user, mount,
pid, IPC and net namespaces (``unshare``). ``-I -S``: no ``PYTHONPATH``, no site-packages, no ``.pth``
file and no module of the checkout can run before the box stands, so this file imports the standard
library only (never ``cutile_perf``), and the pure plan functions below are what ``box`` and the
tests import.

The spec (JSON): ``binds`` ``[[host source, box target], ...]`` writable; ``hide`` host paths
covered by an empty tmpfs; ``reveal`` host paths under a hidden one that come back read-only at the
same path (the interpreter's environment, the harness package); ``cwd`` inside the box;
``refuse`` (optional): one line saying why the command cannot run in this box (``box.wrap`` found
its interpreter hidden): it is printed and the command never runs.

Order (``setup_plan``): mounts private; descriptors on every bind source (they may lie under a
path about to be hidden); an empty tmpfs over each hidden path (``/tmp`` always: the fixed box paths
live there); the revealed paths bound back; the writable binds at their box targets; a private
``/dev`` (a tmpfs holding only the host's nodes a child needs, each bound from the host, the usual
``/proc/self/fd`` links, a private ``/dev/shm`` tmpfs and a fresh ``/dev/pts``). Then
``remount_plan`` over ``/proc/self/mountinfo``: every other mount read-only (that private ``/dev``
and its nodes included, so a child that is root on the host can neither add, rename nor delete an
entry of it, nor chmod a node it shares with the host),
keeping the flags a user namespace may not drop (nosuid, nodev, noexec, atime). ``check`` then reads
every mount point back and refuses to run the command if one outside the allowed set is writable.
Last, every capability is dropped (bounding set included) with no-new-privs, so the command cannot
remount, unmount or mount anything in this namespace; a namespace it creates itself gets the mounts
locked (the kernel's rule for a less privileged copy).

As the pid namespace's init, this process forwards SIGTERM/SIGINT/SIGHUP to the command, reaps
orphans, and exits with the command's status (128 + N when a signal N killed it: an init cannot be
killed by its own signals). When it exits, the kernel kills whatever is left in the namespace.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import stat
import sys

BOX = "/tmp/cutile-perf-box"  # the fixed folder of box paths (inside the tmpfs over /tmp)
SETUP_FAILED = 125  # exit status when the box cannot be set up: the command never ran

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24

# Per-mount options of /proc/self/mountinfo that a remount in a user namespace must keep.
_LOCKED_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                 "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
# Mounts the command needs as they are: its own /proc (unshare --mount-proc).
KEEP_AS_IS = ("/proc",)

# The host's /dev entries a child sees (bound read-only into the box's own /dev): the ordinary
# character devices, and every NVIDIA node (nvidia0.., nvidiactl, nvidia-uvm, nvidia-modeset, the
# nvidia-caps folder of MIG capabilities). Nothing else of the host's /dev (disks, kvm, loop,
# consoles) is reachable, and the box's /dev itself is read-only: root or not, a child cannot add,
# rename or delete an entry of the host's /dev.
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_PREFIXES = ("nvidia",)
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx"))

PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522


# --- the plan (pure) -------------------------------------------------------------------------------


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def hidden_roots(spec: dict) -> list[str]:
    """The paths covered by an empty tmpfs: ``/tmp`` and the spec's, none nested in another."""
    roots: list[str] = []
    for path in sorted({"/tmp", *spec.get("hide", ())}, key=len):
        if not any(_under(path, r) for r in roots):
            roots.append(path)
    return roots


def writable_targets(spec: dict) -> list[str]:
    return [target for _source, target in spec.get("binds", ())] + ["/dev/shm", "/dev/pts"]


def device_names(entries: list[str]) -> list[str]:
    """The names of ``/dev`` (``entries``: its listing) that the box binds in, sorted."""
    return sorted(name for name in entries if name in DEV_NODES or name.startswith(DEV_PREFIXES))


def setup_plan(spec: dict, devices: list[str] = ()) -> list[tuple]:
    """The mount operations before the read-only pass, in order, from the spec and ``devices``
    (``device_names`` of the host's ``/dev``).

    ``("private", "/")``, ``("open", source)``, ``("tmpfs", path)``, ``("mkdirs", path)``,
    ``("bind", source, target)`` (source as given: the executor binds from the opened descriptor),
    ``("stub", source, target)`` (an empty file or folder, as the source is, to bind it on),
    ``("symlink", target, path)``, ``("devpts", path)``."""
    plan: list[tuple] = [("private", "/")]
    reveal = [p for p in spec.get("reveal", ()) if any(_under(p, r) for r in hidden_roots(spec))]
    nodes = [f"/dev/{name}" for name in devices]
    # Descriptors first: every bind source may lie under a path about to be hidden (the host's
    # /dev nodes under the box's own /dev).
    sources = [*reveal, *(source for source, _target in spec.get("binds", ())), *nodes]
    plan += [("open", source) for source in dict.fromkeys(sources)]
    plan += [("tmpfs", root) for root in hidden_roots(spec)]
    for path in reveal:
        plan += [("mkdirs", path), ("bind", path, path)]
    for source, target in spec.get("binds", ()):
        plan += [("mkdirs", target), ("bind", source, target)]
    plan.append(("tmpfs", "/dev"))
    for node in nodes:
        plan += [("stub", node, node), ("bind", node, node)]
    plan += [("symlink", target, f"/dev/{name}") for name, target in DEV_LINKS]
    plan += [("mkdirs", "/dev/shm"), ("tmpfs", "/dev/shm"), ("mkdirs", "/dev/pts"), ("devpts", "/dev/pts")]
    return plan


def parse_mountinfo(text: str) -> list[tuple[str, set[str]]]:
    """``(mount point, per-mount options)`` for each line of ``/proc/self/mountinfo``, in order."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040: a space
        out.append((point, set(fields[5].split(","))))
    return out


def _kept(point: str, spec: dict) -> bool:
    return any(_under(point, keep) for keep in KEEP_AS_IS) or any(_under(point, t) for t in writable_targets(spec))


def remount_plan(spec: dict, mountinfo: str) -> list[tuple[str, int]]:
    """``(mount point, flags)``: a read-only bind remount for every mount the command may not write."""
    plan = []
    for point, options in parse_mountinfo(mountinfo):
        if _kept(point, spec):
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for name, bit in _LOCKED_FLAGS.items():
            if name in options:
                flags |= bit
        plan.append((point, flags))
    return plan


# --- doing it ---------------------------------------------------------------------------------------


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = (lambda s: None if s is None else os.fsencode(s))
    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} -> {target} ({fstype}, {flags:#x}): {os.strerror(err)}")


def _open_source(path: str) -> int:
    """An ``O_PATH`` descriptor on a bind source: a folder, or under ``/dev`` a device node or a
    folder of them (never a link: it could point anywhere)."""
    if not path.startswith("/dev/"):
        return os.open(path, os.O_PATH | os.O_DIRECTORY)
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISCHR(mode) or stat.S_ISDIR(mode)):
        os.close(fd)
        raise OSError(f"{path} is neither a character device nor a folder")
    return fd


def setup(spec: dict) -> None:
    libc = _libc()
    fds: dict[str, int] = {}
    try:
        for op in setup_plan(spec, device_names(os.listdir("/dev"))):
            kind = op[0]
            if kind == "private":
                _mount(libc, None, op[1], None, MS_REC | MS_PRIVATE)
            elif kind == "open":
                fds[op[1]] = _open_source(op[1])
            elif kind == "tmpfs":
                if not os.path.isdir(op[1]):  # nothing there to hide
                    continue
                _mount(libc, "tmpfs", op[1], "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
            elif kind == "mkdirs":
                os.makedirs(op[1], exist_ok=True)
            elif kind == "stub":
                if stat.S_ISDIR(os.fstat(fds[op[1]]).st_mode):
                    os.mkdir(op[2])
                else:
                    os.close(os.open(op[2], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            elif kind == "bind":
                _mount(libc, f"/proc/self/fd/{fds[op[1]]}", op[2], None, MS_BIND | MS_REC)
            elif kind == "symlink":
                os.symlink(op[1], op[2])
            elif kind == "devpts":
                # A fresh instance: the host's terminals stay out of reach. Only for a child that
                # opens a pseudo-terminal; a kernel that refuses it leaves /dev/ptmx dangling.
                try:
                    _mount(libc, "devpts", op[1], "devpts", MS_NOSUID | MS_NOEXEC,
                           "newinstance,ptmxmode=0666,mode=0620")
                except OSError:
                    pass
    finally:
        for fd in fds.values():
            os.close(fd)
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        mountinfo = fh.read()
    for point, flags in remount_plan(spec, mountinfo):
        try:
            _mount(libc, None, point, None, flags)
        except OSError:
            pass  # unreachable (under a hidden path) or already locked read-only: check() decides
    check(spec)


def check(spec: dict) -> None:
    """Refuse (raise) when any reachable mount outside the allowed set can be written."""
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        points = {point for point, _options in parse_mountinfo(fh.read())}
    for point in sorted(points):
        if _kept(point, spec):
            continue
        try:
            st = os.statvfs(point)
        except OSError:
            continue  # not reachable from here: hidden
        if not st.f_flag & os.ST_RDONLY:
            raise OSError(f"mount {point} is still writable")


def drop_privileges() -> None:
    libc = _libc()
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as fh:
            last = int(fh.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty (two 32-bit words)
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")


def _run(argv: list[str]) -> int:
    child = os.fork()
    if child == 0:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"cutile-perf box: cannot run {argv[0]}: {exc}\n".encode())
        os._exit(127)

    def forward(sig, _frame):
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:  # reap every orphan the namespace hands us until the command itself ends
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child:
            if os.WIFSIGNALED(status):
                return 128 + os.WTERMSIG(status)
            return os.WEXITSTATUS(status)


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        os.write(2, b"usage: boxinit.py SPEC_JSON -- ARGV...\n")
        return SETUP_FAILED
    try:
        spec = json.loads(args[0])
    except ValueError as exc:
        os.write(2, f"cutile-perf box: cannot set up the sandbox: {exc}\n".encode())
        return SETUP_FAILED
    if spec.get("refuse"):  # the host side found the command cannot run here: say so, run nothing
        os.write(2, f"cutile-perf box: {spec['refuse']}\n".encode())
        return SETUP_FAILED
    try:
        setup(spec)
        os.chdir(spec.get("cwd") or "/")
        drop_privileges()
    except Exception as exc:  # noqa: BLE001 - any failure means no box: the command must not run
        os.write(2, f"cutile-perf box: cannot set up the sandbox: {exc}\n".encode())
        return SETUP_FAILED
    return _run(args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
