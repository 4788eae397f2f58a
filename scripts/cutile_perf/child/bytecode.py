"""The bytecode of installed code: compiled once by the harness, read by every boxed child.

Why it exists. A fresh test child imports torch, cuda.tile and pytest before its first test. Where
the interpreter's packages were installed without their bytecode (uv, for one, writes none unless
asked) and the child may not write any (a boxed child sees site-packages read-only, and
``PYTHONDONTWRITEBYTECODE`` is set for it: ``pristine.child_env``), every child compiles those
thousands of modules from source again, which costs seconds per child (``import torch, cuda.tile,
pytest`` with and without their bytecode: ``docs/results/2026-12-02-h200-speed.md``, sections 1 and
16). The correctness child starts with the try, so those seconds are on every try's path;
the shares of a sharded correctness run (``correctness_jobs``) each compiled everything into a
fresh folder of their own.

What it does. ``prepare`` runs one process of the harness's own before any child of the command:
it imports those modules with ``PYTHONPYCACHEPREFIX`` set to a folder of the user's, one per
interpreter (``pristine.user_folder``), so Python writes their bytecode there. It
runs no code of the repository: ``-P`` and an empty working folder keep the checkout off its path,
and it sees no GPU. Boxed children get the same ``PYTHONPYCACHEPREFIX``, and the box shows that
folder read-only (``box.for_stage``): Python reads it and cannot write to it.

Why that is safe. A ``.pyc`` is what Python runs instead of the source beside it. Only ``prepare``'s
process writes the folder, compiling installed sources. A child can neither add nor change a file
in it (``tests/test_redteam.py`` plants bytecode there for the next child: the read-only mount is
what stops it). Unboxed children never get it, since they could write to it. Python checks each
``.pyc`` against its source's mtime and size, so an upgraded package is compiled from source
again, and ``prepare`` fills the folder anew when an imported module's file has changed.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.child import pristine

FOLDER = "installed-bytecode-{}"  # in pristine.user_folder(), per interpreter
MARKER = "filled.json"  # written by the filling process: {module: [file, mtime_ns, size] or null}
FILL_TIMEOUT_S = 300.0
FILLED_NOW = "filled now"  # prepare's word when this call compiled the bytecode

# The filling process: import each module named on the command line (one that fails is recorded as
# null, so it is not tried again on every command), then write the marker with each module's file.
_FILLER = """
import importlib, json, os, sys
prefix, names = sys.argv[1], sys.argv[2:]
found = {}
for name in names:
    try:
        module = importlib.import_module(name)
        path = getattr(module, "__file__", None)
        st = os.stat(path) if path else None
        found[name] = [path, st.st_mtime_ns, st.st_size] if st else None
    except BaseException:
        found[name] = None
marker = os.path.join(prefix, "filled.json")
scratch = f"{marker}.{os.getpid()}.tmp"  # two commands may fill at once
with open(scratch, "w", encoding="utf-8") as f:
    json.dump({"python": sys.executable, "modules": found}, f)
os.replace(scratch, marker)
"""


def folder() -> Path | None:
    """Where this interpreter's installed-code bytecode lives, or None when no safe folder is ours.
    It holds the bytecode of installed files only, which no repository changes, so every session
    of the user's shares it."""
    root = pristine.user_folder()
    tag = hashlib.sha256(sys.executable.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return None if root is None else root / FOLDER.format(tag)


def _recorded(prefix: Path) -> dict:
    try:
        data = json.loads((prefix / MARKER).read_text(encoding="utf-8"))
        return data["modules"] if data.get("python") == sys.executable and isinstance(data["modules"], dict) else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def is_filled(prefix: Path, modules: Sequence[str]) -> bool:
    """Whether ``prefix`` holds the bytecode of ``modules`` for this interpreter, and no module it
    imported has a changed file since (an upgrade: fill it again)."""
    recorded = _recorded(prefix)
    if not recorded or not all(name in recorded for name in modules):
        return False
    try:
        for entry in recorded.values():
            if entry is None:  # it failed to import: not tried again on every command
                continue
            path, mtime_ns, size = entry
            st = os.stat(path)
            if (st.st_mtime_ns, st.st_size) != (mtime_ns, size):
                return False
    except (OSError, ValueError, TypeError):
        return False
    return True


def partly_filled(first: Sequence[str], modules: Sequence[str]) -> Path | None:
    """The folder when it holds ``first`` (what every child imports first) but not all of
    ``modules``: usable now, while the rest is compiled. None otherwise (or when switched off)."""
    if not knobs.installed_bytecode_on():
        return None
    prefix = folder()
    if prefix is None or not is_filled(prefix, first) or is_filled(prefix, modules):
        return None
    return prefix


def filler_env(prefix: Path, scratch: str) -> dict[str, str]:
    """The filling process's environment: a test child's allow-list (``knobs.allowed_child_env``:
    no start-up hooks of the user's), the harness's own import path, bytecode written into
    ``prefix`` only, ``scratch`` for home and temp files, and no GPU."""
    return knobs.allowed_child_env(PYTHONPATH=knobs.pythonpath(), PYTHONPYCACHEPREFIX=str(prefix),
                                   PYTHONNOUSERSITE="1", CUDA_VISIBLE_DEVICES="", HOME=scratch, TMPDIR=scratch)


def prepare(modules: Sequence[str], timeout_s: float = FILL_TIMEOUT_S) -> tuple[Path | None, str]:
    """``(folder, why)``: this interpreter's installed-code bytecode folder, holding ``modules``
    (imported in a process of the harness's own when they are not there yet, with every module an
    earlier call filled), or ``(None, why not)``: switched off (``CUTILE_PERF_INSTALLED_BYTECODE=0``),
    no safe folder, or the filling failed. Children then read what they did before
    (``pristine.child_env``)."""
    if not knobs.installed_bytecode_on():
        return None, "off (CUTILE_PERF_INSTALLED_BYTECODE=0)"
    prefix = folder()
    if prefix is None:
        return None, "no per-user folder of our own in the temp folder"
    if is_filled(prefix, modules):
        return prefix, "filled earlier"
    wanted = sorted(set(modules) | set(_recorded(prefix)))
    try:
        prefix.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="cutile-perf-bytecode-") as empty:
            done = subprocess.run([sys.executable, "-P", "-c", _FILLER, str(prefix), *wanted], cwd=empty,
                                  env=filler_env(prefix, empty), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"filling failed: {exc}"
    if done.returncode != 0 or not is_filled(prefix, wanted):
        last = (done.stderr or b"").decode("utf-8", "replace").strip().splitlines()[-1:]
        return None, f"filling failed (exit {done.returncode}{': ' + last[0] if last else ''})"
    return prefix, FILLED_NOW
