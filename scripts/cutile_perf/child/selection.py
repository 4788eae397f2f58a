"""What a session's correctness or perf command selects, found with ``pytest --collect-only``.

``init`` and ``survey`` ask this before anything is measured: a perf command whose ``-k`` matches
nothing (TileGym's ``test_softmax.py`` has no ``test_perf``) would otherwise pass init and fail
only at the baseline. Collection imports the test module but runs no test, so it needs no GPU
unless the test module itself does at import time.
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cutile_perf.child import envcheck, pristine, records, runner
from cutile_perf.store import remove_tree, session as session_mod

# Verbosity flags are dropped: "-v" would turn the one-node-id-per-line listing into a tree.
_VERBOSITY = {"-v", "-vv", "-vvv", "--verbose", "-q", "-qq", "--quiet"}
# `--collect-only -q` lists node ids ("tests/x.py::test_a[1]") one per line, then a summary.
_NODE_ID = re.compile(r"^\S+\.py::\S")
COLLECT_TIMEOUT_S = 300.0


def perf_command(perf_rel: str | None) -> str:
    """The session's perf command; a perf test in its own file (``scaffold-perf``'s ``test_<op>_perf.py``)
    is named literally, since ``{test}`` is the correctness test file."""
    if not perf_rel:
        return session_mod.PERF_TEMPLATE
    return session_mod.PERF_TEMPLATE.replace("{test}", shlex.quote(perf_rel))


@dataclass(frozen=True)
class Selection:
    """The tests one command selects; ``error`` is set when pytest could not collect at all."""

    which: str  # "correctness" or "perf"
    argv: tuple[str, ...]
    node_ids: tuple[str, ...]
    returncode: int | None
    error: str = ""
    # Set when the collection failed because this machine has no usable CUDA (``needs_cuda``):
    # where and what, in one line. Every other collection in the repository fails the same way.
    needs_cuda: str = ""

    @property
    def count(self) -> int:
        return len(self.node_ids)

    @property
    def empty(self) -> bool:
        """Collected fine and selected nothing (pytest's "no tests collected/ran", exit 5, or 0 ids)."""
        return not self.error and not self.node_ids

    def to_dict(self) -> dict:
        return {"which": self.which, "count": self.count, "error": self.error, "needs_cuda": self.needs_cuda,
                "first": list(self.node_ids[:3])}

    def not_collected(self, which: str) -> Selection:
        """The same failure for another command that was not collected (it would fail alike)."""
        return Selection(which, (), (), None, self.error, self.needs_cuda)

    @property
    def missing_module(self) -> str:
        """The module whose failed import skipped the whole collection ('' when none did)."""
        found = re.search(r"could not import '([\w.]+)'", self.error)
        return found[1] if found else ""


# What installs the modules a target's tests import that the base install lacks: the pins of the
# `gpu` extra (envcheck keeps them, checked against pyproject.toml), so the hint installs what was measured.
_INSTALL = {"torch": envcheck.TORCH_INSTALL_HINT, "cuda": envcheck.INSTALL_HINT}
# pytest's short summary of a skip, shown by `-rs`: "SKIPPED [1] tests/common.py:14: could not import 'torch': ..."
_IMPORT_SKIP = re.compile(r"^SKIPPED \[\d+\] (?P<reason>\S+: could not import '[\w.]+'.*)$")


def find_import_skip(text: str) -> str:
    """The first skip of a whole module for a failed import in pytest's output, or '' (pure)."""
    return next((m["reason"][:300] for line in text.splitlines() if (m := _IMPORT_SKIP.match(line.strip()))), "")


def install_hint(module: str) -> str:
    """What to run so ``module`` imports: the `gpu` extra's pins for torch and cuda.tile."""
    command = _INSTALL.get(module.split(".")[0])
    if command:
        return f"install it: {command} (cutile-perf's `gpu` extra brings it)"
    return f"install the package that provides `{module}` in this Python"


# What torch, the driver and CUDA say when there is no usable GPU. Matched case-sensitively, so
# "No module named 'cuda'" (a missing cuda-tile install, not a missing GPU) is not one of them.
_NO_CUDA = re.compile(
    r"Torch not compiled with CUDA enabled|Found no NVIDIA driver|No CUDA GPUs are available"
    r"|CUDA driver initialization failed|no CUDA-capable device|CUDA driver version is insufficient"
    r"|libcuda\.so[.\d]*: cannot open|cudaErrorNoDevice|cudaErrorInsufficientDriver")
# An exception line naming CUDA ("RuntimeError: CUDA unavailable", pytest's "E   ...CUDA...").
_CUDA_EXCEPTION = re.compile(r"^(?:E\s+)?[\w.]*(?:Error|Exception)\b.*\bCUDA\b")
# A frame of a Python traceback, or of pytest's own report of a collection error ("path:12: in <module>").
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)'
                    r'|^(?P<pfile>[^\s:]+\.py):(?P<pline>\d+): in (?P<pfunc>\S+)')


def needs_cuda(text: str, root: Path | None = None) -> str:
    """'' or one line saying that a failed collection failed for want of CUDA, and where (pure).

    ``text``: pytest's output. The place is the innermost traceback frame inside ``root`` (the
    repository: its conftest or test module), e.g. "tests/conftest.py:66 in pytest_addoption:
    AssertionError: Torch not compiled with CUDA enabled".
    """
    # pytest prefixes a failure in its own hooks (a conftest's pytest_configure) with "INTERNALERROR> ".
    lines = [re.sub(r"^INTERNALERROR>\s?", "", ln.rstrip()) for ln in text.splitlines()]
    cause = next((ln.strip() for ln in reversed(lines) if _NO_CUDA.search(ln) and not ln.lstrip().startswith("File ")),
                 "")
    if not cause:
        cause = next((ln.strip() for ln in reversed(lines) if _CUDA_EXCEPTION.match(ln.strip())), "")
    if not cause:
        return ""
    cause = re.sub(r"^E\s+", "", cause)
    where = ""
    resolved_root = Path(root).resolve() if root is not None else None
    for line in lines:
        frame = _FRAME.match(line)
        if not frame or resolved_root is None:
            continue
        path = Path(frame["file"] or frame["pfile"])
        path = (path if path.is_absolute() else resolved_root / path).resolve()
        if path.is_relative_to(resolved_root) and path.is_file():
            where = (f"{path.relative_to(resolved_root).as_posix()}:{frame['line'] or frame['pline']} "
                     f"in {frame['func'] or frame['pfunc']}")
    return f"{where}: {cause}"[:300] if where else cause[:300]


def collect_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` turned into a collection-only run that prints one node id per line.

    The record plugin is loaded so a ``--print-record`` in the perf command is a known option even
    where the target's conftest does not define it; the cache plugin is off so nothing is written.
    """
    kept = [a for a in argv if a not in _VERBOSITY]
    # `-rs` prints the reason of each skip: a module skipped for a missing import says which.
    return [*kept, "--collect-only", "-q", "-rs", "-p", "no:cacheprovider", *records.PYTEST_PLUGIN_ARGS]


def parse_collect_output(text: str) -> list[str]:
    """The node ids listed by ``pytest --collect-only -q`` (pure; tested with captured output)."""
    return [line.strip() for line in text.splitlines() if _NODE_ID.match(line.strip())]


def error_summary(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
    errors = [ln for ln in lines if ln.startswith("E ") or "Error" in ln or ln.startswith("ERROR")]
    return " | ".join((errors or lines)[-3:])[:400] or "pytest produced no output"


def import_env(session: session_mod.Session) -> dict[str, str]:
    """The session's checkout first on PYTHONPATH (``pristine.import_path``), for init's and survey's
    children: they import the fenced code from where the measured runs of ``try`` do."""
    return pristine.import_path(session.repo, session.kernel_files, os.environ.get("PYTHONPATH", ""))


def collect(which: str, argv: Sequence[str], *, cwd: Path, timeout_s: float = COLLECT_TIMEOUT_S,
            env: dict[str, str] | None = None) -> Selection:
    """Run the collection of ``argv`` in ``cwd``; never raises for a failing pytest.

    Output goes to a temporary file (the runner's rule: never an unread pipe) and bytecode writing
    is off, so a refused ``init`` leaves the repository exactly as it was. ``env``: more variables
    for the child (the checkout's import path, ``import_env``).
    """
    full = collect_argv(argv)
    with remove_tree.temporary_folder("cutile-perf-collect-") as tmp:  # removed at any depth
        out = Path(tmp) / f"{which}.log"
        result = runner.run(full, cwd=cwd, timeout_s=timeout_s, output_path=out,
                            env_overrides={**(env or {}), "PYTHONDONTWRITEBYTECODE": "1"})
        text = result.tail(1_000_000)
    ids = parse_collect_output(text)
    error = cuda = ""
    if result.timed_out:
        error = f"collection did not finish within {timeout_s:g} s"
    elif result.returncode not in (runner.PYTEST_OK, runner.PYTEST_NO_TESTS):
        error = f"pytest exit {result.returncode}: {error_summary(text)}"
        cuda = needs_cuda(text, cwd)
    elif not ids and (skip := find_import_skip(text)):
        # Not "selects nothing": pytest.importorskip (the bundled kernels' tests do it for torch)
        # skipped the module, so what is missing is a package, not a test.
        error = f"skipped for a missing import: {skip}"
    return Selection(which, tuple(full), tuple(ids), result.returncode, error, cuda)
