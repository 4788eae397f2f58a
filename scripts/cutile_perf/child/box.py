"""A sandbox for one pytest child: Linux namespaces through the ``unshare`` command.

The test child runs code the candidate kernel module brings (its top level runs at import), so it
runs in a box: its own user, mount, pid, IPC and net namespaces (``unshare --user --map-root-user
--mount --pid --ipc --net --fork --mount-proc --kill-child``), the mounts set up by ``boxinit.py``
before any user code, writable only where the harness binds it (at fixed paths under
``/tmp/cutile-perf-box/``, so every slot and command looks alike to the child and cuTile's cache
keys match), and the environment from ``knobs.CHILD_ENV_ALLOWED``. What is writable, hidden and
read-only, and what the box does not stop: ``docs/design.md``, "The box".

``available()`` says why no box can be had here (None: it can); ``decide`` applies the session's
``sandbox`` setting and CUTILE_PERF_SANDBOX. Where there is no box, the stage says so
(``Stage.sandbox == "none: <why>"``): never a silent fallback. A command whose interpreter (or its
environment) the box would hide is not run: the child's output says so in one line with the fix
(``hidden_interpreter``).
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.child import boxinit

UNSHARE_FLAGS = ("--user", "--map-root-user", "--mount", "--pid", "--ipc", "--net", "--fork", "--mount-proc",
                 "--kill-child")
BOX = boxinit.BOX
CHECKOUT = f"{BOX}/checkout"
RUN = f"{BOX}/run"
CACHE = f"{BOX}/jit-cache"
SCRATCH = f"{RUN}/scratch"
LABEL = "unshare"
SETUP_FAILED = boxinit.SETUP_FAILED
_PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Box:
    """Where one child's writable folders appear inside its box, and what it may not see."""

    binds: tuple[tuple[str, str], ...]  # (host folder, box path), writable
    hide: tuple[str, ...]  # host folders covered by an empty tmpfs (/tmp always)
    reveal: tuple[str, ...] = ()  # host folders under a hidden one that come back read-only

    def to_box(self, path: str) -> str:
        """``path`` as the child sees it (unchanged when it is in no writable folder)."""
        for host, inside in self.binds:
            if path == host or path.startswith(host.rstrip("/") + "/"):
                return inside + path[len(host):]
        return path

    def to_host(self, path: str) -> str:
        """A path the child reported (a module's file), as the harness sees it."""
        for host, inside in self.binds:
            if path == inside or path.startswith(inside + "/"):
                return host + path[len(inside):]
        return path

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with every path in a writable folder rewritten to its box path (lists too)."""
        out = {k: os.pathsep.join(self.to_box(part) for part in v.split(os.pathsep)) for k, v in env.items()}
        for name in ("HOME", "TMPDIR", "TMP", "TEMP"):
            out[name] = SCRATCH
        return out

    def spec(self, cwd: Path | str, refuse: str | None = None) -> dict:
        spec = {"binds": [list(b) for b in self.binds], "hide": list(self.hide), "reveal": list(self.reveal),
                "cwd": self.to_box(str(cwd))}
        if refuse:
            spec["refuse"] = refuse
        return spec

    def shows(self, path: str) -> bool:
        """Whether the child sees ``path`` (a host path) at the same path: outside every hidden
        folder, or under a revealed one."""
        hidden = boxinit.hidden_roots({"hide": self.hide})
        return not any(_under(path, h) for h in hidden) or any(_under(path, r) for r in self.reveal)

    def wrap(self, argv: list[str], cwd: Path | str) -> list[str]:
        """The command line that runs ``argv`` (started in ``cwd``) inside the box. When the box
        would hide ``argv``'s interpreter, the box prints why and runs nothing (``hidden_interpreter``)."""
        refuse = hidden_interpreter(argv[0], self, os.environ.get("PATH", os.defpath)) if argv else None
        return [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, sys.executable, "-I", "-S", boxinit.__file__,
                json.dumps(self.spec(cwd, refuse)), "--", *argv]


def _shebang(path: str, search_path: str) -> str | None:
    """The interpreter a script's ``#!`` line names (``/usr/bin/env NAME`` looked up on
    ``search_path``), or None for a binary or an unreadable file."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if len(words) >= 2 and os.path.basename(words[0]) == "env":
        return shutil.which(words[1], path=search_path)
    return words[0] if words else None


def interpreter_needs(executable: str, search_path: str) -> tuple[str, list[str]]:
    """``(interpreter, paths)``: the interpreter that runs ``executable`` (itself, or its ``#!``
    line's) and the host paths it needs to see: the command, the interpreter and its real file, and
    its environment (a venv's folder, where ``pyvenv.cfg`` lies beside ``bin``; else the prefix
    above the real file's ``bin``)."""
    interpreter = _shebang(executable, search_path) or executable
    real = os.path.realpath(interpreter)
    needs = [executable, interpreter, real]
    venv = next((d for d in (os.path.dirname(interpreter), os.path.dirname(os.path.dirname(interpreter)))
                 if os.path.isfile(os.path.join(d, "pyvenv.cfg"))), None)
    if venv is not None:
        needs.append(venv)
    elif os.path.basename(os.path.dirname(real)) == "bin":
        needs.append(os.path.dirname(os.path.dirname(real)))
    return interpreter, list(dict.fromkeys(os.path.abspath(p) for p in needs))


def hidden_interpreter(command: str, the_box: Box, search_path: str) -> str | None:
    """One line saying that the box hides what ``command`` (an argv[0]) needs to run, with the fix;
    None when it sees all of it (or the command is found nowhere: the box says it cannot run it).

    Without this, a test interpreter in a venv under ``/tmp`` (hidden; only its ``bin`` on PATH
    comes back) starts without its environment and the row says only "No module named pytest"."""
    executable = command if "/" in command else shutil.which(command, path=search_path)
    if not executable or not os.path.exists(executable):
        return None
    interpreter, needs = interpreter_needs(os.path.abspath(executable), search_path)
    missing = next((p for p in needs if not the_box.shows(p)), None)
    if missing is None:
        return None
    root = next(h for h in boxinit.hidden_roots({"hide": the_box.hide}) if _under(missing, h))
    return (f"Error: the sandbox hides {missing} (everything under {root} is hidden from a test child), "
            f"which the test command's interpreter {interpreter} needs: install that environment outside "
            f"{root}, run cutile-perf itself with that interpreter, or turn the box off "
            f"(CUTILE_PERF_SANDBOX=off)")


def for_stage(repo: Path, checkout_root: Path, private: Path, compile_cache: Path | None,
              read_only: tuple[Path, ...] = ()) -> Box:
    """The box of one test child: the checkout, the run's ``private`` folder (a ``scratch``
    folder is made in it for HOME and TMPDIR) and the guarded compile cache are writable;
    ``read_only`` folders of the harness's (the installed-code bytecode, ``child.bytecode``) are
    shown read-only at their own paths, even under the hidden temp folder."""
    (private / "scratch").mkdir(exist_ok=True)
    binds = [(_real(checkout_root), CHECKOUT), (_real(private), RUN)]
    if compile_cache is not None:
        compile_cache.mkdir(parents=True, exist_ok=True)
        binds.append((_real(compile_cache), CACHE))
    return make(binds, hide=[_real(repo), _real(tempfile.gettempdir())], read_only=read_only)


def make(binds: list[tuple[str, str]], hide: list[str], read_only: tuple[Path, ...] = ()) -> Box:
    """A box with the interpreter, this package and ``read_only`` revealed where ``hide`` (or /tmp)
    covers them."""
    hidden = boxinit.hidden_roots({"hide": hide})
    wanted = {_real(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                 os.path.dirname(os.path.realpath(sys.executable)), str(Path(__file__).resolve().parents[2]),
                                 *read_only)}
    # The toolchain the harness itself runs with (cuda.tile on PYTHONPATH, tileiras on PATH, its
    # libraries): a GPU host's set-up may unpack it under /tmp, which the box hides. Never anything
    # inside the user's repository (``hide[0]`` for a stage): the child imports from its checkout.
    own = [h for h in hide[:1] if h != _real(tempfile.gettempdir())]
    wanted |= {_real(p) for p in knobs.search_path_dirs() if os.path.isdir(p)
               and not any(_under(_real(p), o) for o in own)}
    reveal = sorted(p for p in wanted if any(_under(p, h) for h in hidden))
    return Box(tuple(binds), tuple(hide), tuple(reveal))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _real(path: Path | str) -> str:
    return os.path.realpath(path)


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """Why no child can run in a box on this machine, or None when it can (probed once: a trivial
    command in a full box, the same set-up as a test child's)."""
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    if not shutil.which("unshare"):
        return "the unshare command (util-linux) is not installed"
    for path, meaning in (("/proc/sys/kernel/unprivileged_userns_clone", "unprivileged user namespaces are disabled"),
                          ("/proc/sys/user/max_user_namespaces", "user namespaces are disabled (max_user_namespaces=0)")):
        try:
            if Path(path).read_text().strip() == "0":
                return meaning
        except OSError:
            pass
    probe = Path(tempfile.mkdtemp(prefix="cutile-perf-boxprobe-"))
    try:
        box = make([(_real(probe), CHECKOUT)], hide=[_real(tempfile.gettempdir())])
        argv = box.wrap([sys.executable, "-I", "-S", "-c",
                         f"open({CHECKOUT + '/ok'!r}, 'w').close()"], probe)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S,
                                  env=knobs.allowed_child_env(), stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the sandbox probe failed: {exc}"
        if done.returncode != 0 or not (probe / "ok").exists():
            lines = [ln for ln in (done.stderr or "").splitlines() if ln.strip()]
            why = lines[-1].strip() if lines else f"exit {done.returncode}"
            if "Operation not permitted" in why and "unshare" in why:
                why = f"unprivileged user namespaces are not allowed here ({why})"
            return f"the sandbox probe failed: {why}"
        return None
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def decide(session_mode: str) -> str | None:
    """Why this stage's children run without a box ("off (...)" or ``available()``'s reason), or
    None when they run in one. ``session_mode``: the session's ``sandbox`` setting (auto, off)."""
    if knobs.sandbox_override() == "off":
        return "off (CUTILE_PERF_SANDBOX=off)"
    if str(session_mode).strip().lower() == "off":
        return "off (session.yaml sandbox: off)"
    return available()


def label(why_not: str | None) -> str:
    """What ``Stage.sandbox`` records: ``"unshare"`` or ``"none: <why>"``."""
    return LABEL if why_not is None else f"none: {why_not}"


def returncode(code: int | None) -> int | None:
    """The command's own status from the box's: 128 + N (an init cannot die of its own signal N)
    becomes -N, as if the command had not been boxed."""
    if code is not None and 128 < code < 128 + 65:
        return -(code - 128)
    return code
