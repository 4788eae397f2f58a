"""A pytest child started ahead of its turn, held before it runs any code of the repository.

The interleaved re-check and the baseline run perf children one after another, each fresh (runs
in one process would share its state, so the samples would not be independent). Most of a fresh
child's start-up belongs to no repository (the interpreter, torch, cuda.tile, pytest); this module
lets the next run pay that while the current one starts, and nothing more:

    python -P -m cutile_perf.child.warmstart <pytest arguments>

1. It starts with no folder of the checkout on ``sys.path`` (``-P``; the checkout's ``PYTHONPATH``
   entries wait in ``CUTILE_PERF_LATE_PYTHONPATH``), so it can import only installed code.
2. It imports ``warm_modules`` and the baseline's preloads (``CUTILE_PERF_PRELOAD``), pays the
   profiler's set-up without a CUDA context, says so on ``CUTILE_PERF_READY_FD`` and blocks on
   ``CUTILE_PERF_START_FD`` (the byte ``1`` and its run's ``CUTILE_PERF_SELECT``: go; end of file
   first: cancelled). A preload that went near the GPU or started a thread makes it start again
   without preloads (``preload_problem``).
3. Let go, it puts the path back as ``python -m pytest`` would have had it and runs pytest in this
   process, or re-executes itself as that plain command when a module it imported would now be
   found in the checkout (``numpy.py`` shipped by the repository).

The harness (``child.pool``) lets a timed run's first test start only once every spare is blocked
here. Cancelled, a spare exits with ``CANCELLED`` without having run anything of the repository.
Why each step, and what it saves: ``docs/design.md``, "What a spare does while it waits".
"""
from __future__ import annotations

import importlib
import os
import runpy
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Imported before the gate: everything a perf child of any cuTile repository imports first. Not the
# record plugin: it must load as pytest loads it, after the gate (it takes its descriptors then).
WARM_MODULES = ("torch", "cuda.tile", "pytest")
CANCELLED = 75  # EX_TEMPFAIL: the run it was started for did not happen


def warm_modules() -> tuple[str, ...]:
    """What this host's spares import first: ``WARM_MODULES``, or pytest alone on a host without a
    GPU (``bench.cuda_host``), where a test that needs torch imports it after the gate and one that
    does not (the CPU suite's simulated repositories) should not pay seconds of a core for it."""
    from cutile_perf import bench  # noqa: PLC0415 - this module is the child's entry point: imports stay lazy

    return WARM_MODULES if bench.cuda_host() else ("pytest",)


def installed_imports(modules: dict[str, str], inside: Iterable[str | os.PathLike]) -> list[str]:
    """The top-level modules a child imported from installed code, in the order it first imported
    them: ``modules`` is its run report's ``{module: file}``. What a later child started ahead of
    its turn may import while it waits (``CUTILE_PERF_PRELOAD``, learned from the baseline's perf
    runs, whose code is the user's own). Left out: everything whose file lies in ``inside`` (the
    checkout, the run's folder: the repository's code never runs before the gate), the standard
    library (cheap, and partly imported already), what it imports anyway (``WARM_MODULES``), this
    package (pytest loads it as a plugin after the gate), the interpreter's start-up hooks
    (``sitecustomize``), private names and namespace packages (no file of their own)."""
    from cutile_perf import knobs  # noqa: PLC0415 - this module is the child's entry point: imports stay lazy

    roots = [os.path.realpath(p) for p in inside]
    skip = {*(n.partition(".")[0] for n in WARM_MODULES), "cutile_perf", "sitecustomize", "usercustomize",
            *sys.stdlib_module_names}
    found: list[str] = []
    for name in modules:
        top = name.partition(".")[0]
        if top in found or top in skip or top.startswith("_") or not top.isidentifier():
            continue
        file = modules.get(top)
        if not isinstance(file, str) or not os.path.isabs(file):
            continue
        real = os.path.realpath(file)
        if any(real == r or real.startswith(r + os.sep) for r in roots):
            continue
        found.append(top)
        if len(found) == knobs.PRELOAD_MAX:
            break
    return found


def warm_argv(argv: list[str]) -> list[str] | None:
    """The command that starts ``argv`` ahead of its turn, or None when it cannot be: only a
    ``{python} -m pytest ...`` command (``session.argv`` fills ``{python}`` with this interpreter),
    and only on Python 3.11 or later, whose ``-P`` keeps the working directory off the path."""
    if sys.version_info < (3, 11) or len(argv) < 3 or argv[1:3] != ["-m", "pytest"]:
        return None
    if os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return None  # another interpreter: it may not have -P, nor this package
    return [argv[0], "-P", "-m", "cutile_perf.child.warmstart", *argv[3:]]


def split_pythonpath(value: str, cwd: str | os.PathLike) -> tuple[str, str]:
    """``(early, late)``: the ``PYTHONPATH`` the child starts with (its entries outside ``cwd``),
    and the whole value, restored once it is let go. Empty and relative entries name the working
    directory, so they stay out of the early one too."""
    root = os.path.realpath(cwd)
    plain_root = os.path.abspath(cwd)
    early = []
    for entry in value.split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        # Inside by its name or by where it leads: the box rewrites the name, the host resolves links.
        if any(p == r or p.startswith(r + os.sep)
               for p in (os.path.abspath(entry), os.path.realpath(entry)) for r in (root, plain_root)):
            continue
        early.append(entry)
    return os.pathsep.join(early), value


def shadowed(names, entries: list[str]) -> list[str]:
    """Those of the top-level module ``names`` (imported, or looked for and not found, before the
    gate) that ``entries`` (the folders put back on the path) would provide: a ``name.py``,
    ``name.pyc``, ``name/`` or extension module ``name.so`` / ``name.*.so`` there."""
    found = []
    for name in sorted({n for n in names if "." not in n}):
        for entry in entries:
            folder = Path(entry)
            if any((folder / f).exists() for f in (f"{name}.py", f"{name}.pyc", f"{name}.so")) \
                    or (folder / name).is_dir() or any(folder.glob(f"{name}.*.so")):
                found.append(name)
                break
    return found


class _NotFound:
    """Last on ``sys.meta_path`` during the early imports: notes every top-level module they looked
    for and nobody found (optional dependencies: ``import opt_einsum`` inside torch), which a
    fresh child could have found in its checkout."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if path is None:
            self.names.add(name)
        return None


def _pytest_plugin_packages() -> set[str] | None:
    """The top-level packages of pytest's installed plugins (entry points ``pytest11``): pytest
    imports those itself and rewrites their asserts, which it cannot do once they are imported.
    None when the installed metadata cannot be read."""
    from importlib import metadata  # noqa: PLC0415

    try:
        return {ep.value.partition(":")[0].partition(".")[0] for ep in metadata.entry_points(group="pytest11")}
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def _preload(names: list[str]) -> list[str]:
    """Import ``names`` (installed top-level modules; the checkout is not on the path yet), skipping
    pytest's plugins and any that fails: a fresh child imports it after the gate and reports that.
    Nothing when pytest's plugins cannot be told apart (broken metadata): no guessing."""
    plugins = _pytest_plugin_packages()
    if plugins is None:
        return []
    done = []
    for name in names:
        if name in plugins or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except (Exception, SystemExit):  # noqa: BLE001 - see the docstring
            continue
        done.append(name)
    return done


CUDA_ERROR_NOT_INITIALIZED = 3  # what the driver API answers before ``cuInit``


def mapped_paths(maps: str) -> list[str]:
    """The file of every line of a ``/proc/<pid>/maps`` text that names one, in order. A line is
    five fields and then the path, which may itself hold spaces (a folder name, or the kernel's
    " (deleted)" after a file removed since), so it is split five times, not at its last space."""
    paths = []
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6:
            paths.append(fields[5].strip())
    return paths


def _driver_path(maps: str | None = None) -> str | None:
    """The CUDA driver library (``libcuda.so*``) mapped into this process, or None. ``maps``: the
    text of /proc/self/maps (read when None)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    return next((path for path in mapped_paths(maps) if os.path.basename(path).startswith("libcuda.so")), None)


def driver_mapped(maps: str | None = None) -> bool:
    """Whether the CUDA driver library is mapped into this process (``import torch`` maps it on
    the H200 without initializing it)."""
    return _driver_path(maps) is not None


def driver_initialized() -> bool:
    """Whether this process's CUDA driver was initialized (``cuInit``), which every CUDA context
    needs. Asked without initializing it: ``cuDeviceGetCount`` answers CUDA_ERROR_NOT_INITIALIZED
    before ``cuInit``. False when no driver is mapped, or the library mapped has no such function.
    On the H200 it is False after ``import torch, cuda.tile, pytest`` and after TileGym's preloads,
    and True after the CPU-only profiler session, which makes no context either
    (``docs/results/2026-12-02-h200-speed.md``, section 12)."""
    path = _driver_path()
    if path is None:
        return False
    import ctypes  # noqa: PLC0415

    try:
        count = ctypes.c_int()
        return ctypes.CDLL(path).cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class Quiet:
    """What a waiting child may not start on its own, at one moment: the CUDA driver mapped and
    initialized (every CUDA context needs ``cuInit``), torch's CUDA state, and its thread count (a
    thread keeps working while the main one blocks at the gate, beside a timed run)."""

    driver_mapped: bool
    driver_initialized: bool
    torch_cuda: bool
    threads: int

    @classmethod
    def now(cls) -> Quiet:
        torch = sys.modules.get("torch")
        initialized = getattr(getattr(torch, "cuda", None), "is_initialized", lambda: False)
        try:
            torch_cuda = bool(initialized())
        except Exception:  # noqa: BLE001 - a torch in a broken state is no state to wait in
            torch_cuda = True
        try:
            threads = len(os.listdir("/proc/self/task"))
        except OSError:
            threads = 0
        return cls(driver_mapped(), driver_initialized(), torch_cuda, threads)


def preload_problem(before: Quiet, after: Quiet) -> str | None:
    """What the preloads started that a child waiting beside a timed run may not hold, or None.
    A driver already initialized before them leaves the other checks (on the H200 ``import torch``
    maps it, and only the CPU-only profiler session, which runs after the preloads, initializes it)."""
    if after.torch_cuda and not before.torch_cuda:
        return "torch's CUDA was initialized"
    if after.driver_initialized and not before.driver_initialized:
        return "the CUDA driver was initialized"
    if after.driver_mapped and not before.driver_mapped:
        return "the CUDA driver was loaded"
    if after.threads > before.threads:
        return f"{after.threads - before.threads} thread(s) were started"
    return None


def _start_again_without_preload(args: list[str], fds: tuple[int, int], late: str, late_cwd: str) -> None:
    """Become a fresh warm child with ``WARM_MODULES`` alone: what was imported (and any CUDA state
    it made) goes with this process image; the gate's descriptors stay open across ``exec``."""
    os.environ.update({"CUTILE_PERF_READY_FD": str(fds[0]), "CUTILE_PERF_START_FD": str(fds[1]),
                       "CUTILE_PERF_LATE_PYTHONPATH": late, "CUTILE_PERF_LATE_CWD": late_cwd})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-P", "-m", "cutile_perf.child.warmstart", *args])


def _wait(ready_fd: int, start_fd: int) -> bytes | None:
    """Say it is ready and wait: None when cancelled, else what the harness handed over after the
    go byte (empty, or the node ids of a re-check run whose cases were not known when it started,
    ``child.pool.Request.handover``)."""
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    received = bytearray()
    try:
        while chunk := os.read(start_fd, 65536):
            received += chunk
    except OSError:
        received.clear()
    os.close(start_fd)
    return bytes(received[1:]) if received[:1] == b"1" else None


def main(args: list[str]) -> int:
    from cutile_perf import knobs  # noqa: PLC0415 - this module is the child's entry point

    began = time.monotonic()
    ready_fd, start_fd = knobs.take_start_fds()
    late, late_cwd = knobs.take_late_pythonpath(), knobs.take_late_cwd()
    preload = knobs.take_preload()
    early = [e for e in knobs.pythonpath().split(os.pathsep) if e]
    not_found = _NotFound()
    sys.meta_path.append(not_found)
    failed = False
    for name in warm_modules():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a fresh child reports it: the plain command runs below
            failed = True
    if preload and not failed:
        before, started = Quiet.now(), time.perf_counter()
        done = _preload(preload)
        problem = preload_problem(before, Quiet.now())
        if problem:
            print(f"cutile-perf: while preloading, {problem}; starting again without preloads", file=sys.stderr,
                  flush=True)
            _start_again_without_preload(args, (ready_fd, start_fd), late, late_cwd)
        print(f"cutile-perf: preloaded {len(done)} installed module(s) the baseline's tests imported "
              f"({time.perf_counter() - started:.2f} s): {', '.join(done)}", file=sys.stderr, flush=True)
    sys.meta_path.remove(not_found)
    if not failed:
        # The profiler's one-off set-up, without a CUDA context (bench.prepare_profiler_without_context):
        # otherwise the first record's witness pays it after the gate, several seconds a run.
        from cutile_perf import bench  # noqa: PLC0415

        started = time.perf_counter()
        if bench.prepare_profiler_without_context():
            print(f"cutile-perf: profiler set up while waiting ({time.perf_counter() - started:.2f} s, "
                  "no CUDA context)", file=sys.stderr, flush=True)
    ready = time.monotonic()
    handover = _wait(ready_fd, start_fd)
    if handover is None:
        return CANCELLED
    # Whether it was ready before its turn came (a wait near 0 s: let go while it still imported,
    # and the rest of its start-up counts in its stage's time) is what its log must show.
    print(f"cutile-perf: let go after {time.monotonic() - ready:.2f} s at the gate (ready {ready - began:.2f} s "
          "after it began importing)", file=sys.stderr, flush=True)
    if handover:
        # Started before its cases were known: the record plugin reads them when pytest loads it.
        os.environ["CUTILE_PERF_SELECT"] = handover.decode()
    # Started in "/" (runner.run): nothing the loader or Python looks up relative to the working
    # directory before the gate could come from the checkout.
    os.chdir(late_cwd)
    cwd = os.getcwd()
    entries = [e for e in late.split(os.pathsep) if e]
    knobs.set_pythonpath(late)  # what the tests' own subprocesses inherit, as in a fresh child
    inside = set(entries) - set(early)  # the checkout's entries (and any relative one)
    plain = [sys.executable, "-m", "pytest", *args]
    hidden = shadowed({*sys.modules, *not_found.names}, [cwd, *(os.path.join(cwd, e) for e in inside)])
    if failed or hidden:
        # Not what a fresh child would be: become one, and say why (it pays a whole start-up again).
        why = "an early import failed" if failed else f"the checkout provides {', '.join(hidden[:5])}"
        print(f"cutile-perf: {why}: running as a fresh child instead", file=sys.stderr, flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, plain)
    # ``python -m pytest``'s path: the working directory, the whole PYTHONPATH, then what the
    # interpreter added (stdlib, site-packages); the early entries come back in their places.
    sys.path[:] = [cwd, *entries, *(p for p in sys.path if p not in early)]
    # This package was imported before pytest; a pytest that loads it as a plugin would find it
    # already imported and warn that it cannot rewrite its asserts. Forget it, as a fresh child has
    # never seen it, and run pytest as `-m` runs it (its __main__, its argv[0]).
    for name in [n for n in sys.modules if n == "cutile_perf" or n.startswith("cutile_perf.")]:
        del sys.modules[name]
    sys.argv = ["pytest", *args]
    runpy.run_module("pytest", run_name="__main__", alter_sys=True)
    return 0  # pytest's __main__ ends with SystemExit; reached only if it did not


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
