"""The only module that reads ``os.environ``.

Every environment variable that cutile-perf reads has a row, with why it exists, in the knob table
of ``docs/design.md`` (``tests/test_docs_audience.py`` keeps the table and the code in step); the
docs may name other tools' variables too (``tests/doccheck.py``'s ``FOREIGN_ENV_VARS``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from cutile_perf.errors import BadEnvValue

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    # A typo must not silently enable or disable tuning.
    raise BadEnvValue(f"{name}={os.environ[name]!r}: expected one of 1/true/yes/on or 0/false/no/off")


def _path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def installed_bytecode_on() -> bool:
    """False when CUTILE_PERF_INSTALLED_BYTECODE is set to a false value (default: on)."""
    return "CUTILE_PERF_INSTALLED_BYTECODE" not in os.environ or _flag("CUTILE_PERF_INSTALLED_BYTECODE")


def autotune_disabled() -> bool:
    """True when DISABLE_AUTOTUNE or TileGym's TILEGYM_DISABLE_AUTOTUNE is set to a true value."""
    return _flag("DISABLE_AUTOTUNE") or _flag("TILEGYM_DISABLE_AUTOTUNE")


def records_path() -> Path | None:
    return _path("CUTILE_PERF_RECORDS")


def launches_path() -> Path | None:
    return _path("CUTILE_PERF_RECORD_LAUNCHES")


def withheld_examples() -> frozenset[str]:
    """Bundled ops whose prepared steps are not shown (an evaluation on that op is running)."""
    return frozenset(op.strip() for op in os.environ.get("CUTILE_PERF_WITHHOLD_EXAMPLES", "").split(",") if op.strip())


def report_path() -> Path | None:
    return _path("CUTILE_PERF_REPORT")


def shard() -> tuple[int, int] | None:
    """``CUTILE_PERF_SHARD=i/k`` (set by the harness): this pytest child runs the i-th of k shares
    of the selected tests; None when unset."""
    value = os.environ.get("CUTILE_PERF_SHARD", "").strip()
    if not value:
        return None
    index, _, count = value.partition("/")
    try:
        i, k = int(index), int(count)
    except ValueError:
        i, k = -1, 0
    if not 0 <= i < k:
        raise BadEnvValue(f"CUTILE_PERF_SHARD={value!r}: expected INDEX/COUNT with 0 <= INDEX < COUNT")
    return i, k


def _take_fd(name: str) -> int | None:
    """The descriptor number in ``name``, taken out of the environment (once: code imported later
    cannot read it back); None when unset."""
    value = os.environ.pop(name, None)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise BadEnvValue(f"{name}={value!r}: expected a file descriptor number") from None


def take_check_setup() -> tuple[str, Path] | None:
    """("capture" or "replay", folder) of checked timed calls (``child.checked``), taken out of the
    environment when the plugin loads; None: timed calls are not checked."""
    capture = os.environ.pop("CUTILE_PERF_CHECK_DIR", None)
    replay = os.environ.pop("CUTILE_PERF_CHECK_REPLAY", None)
    if replay:
        return "replay", Path(replay)
    return ("capture", Path(capture)) if capture else None


def take_selection() -> frozenset[str] | None:
    """The node ids a child runs alone (``CUTILE_PERF_SELECT``), taken out of the environment when the
    plugin loads, before any code of the target's could change it; None: every selected test."""
    value = os.environ.pop("CUTILE_PERF_SELECT", None)
    return None if value is None else parse_selection(value)


def parse_selection(value: str) -> frozenset[str]:
    """A ``CUTILE_PERF_SELECT`` value (also what a spare child is handed at its start gate): a JSON
    list of pytest node ids."""
    try:
        ids = json.loads(value)
    except ValueError:
        ids = None
    if not (isinstance(ids, list) and ids and all(isinstance(i, str) and i for i in ids)):
        raise BadEnvValue(f"CUTILE_PERF_SELECT={value[:80]!r}: expected a JSON list of pytest node ids")
    return frozenset(ids)


def take_gate_fd() -> int | None:
    """The descriptor of the gate a pre-started perf child waits on (``CUTILE_PERF_GATE_FD``);
    None when the child was not pre-started."""
    return _take_fd("CUTILE_PERF_GATE_FD")


def take_start_fds() -> tuple[int, int]:
    """``(ready, start)``: the descriptors of a child started ahead of its turn (``CUTILE_PERF_READY_FD``,
    ``CUTILE_PERF_START_FD``); both must be set (``child.warmstart`` runs only so)."""
    ready, start = _take_fd("CUTILE_PERF_READY_FD"), _take_fd("CUTILE_PERF_START_FD")
    if ready is None or start is None:
        raise BadEnvValue("CUTILE_PERF_READY_FD and CUTILE_PERF_START_FD: both must be set "
                          "(cutile_perf.child.warmstart is started by the harness only)")
    return ready, start


def take_late_pythonpath() -> str:
    """The whole PYTHONPATH a child started ahead of its turn gets back when let go."""
    return os.environ.pop("CUTILE_PERF_LATE_PYTHONPATH", "")


def take_late_cwd() -> str:
    """The folder a child started ahead of its turn moves to when let go (it starts in "/")."""
    value = os.environ.pop("CUTILE_PERF_LATE_CWD", "")
    if not value:
        raise BadEnvValue("CUTILE_PERF_LATE_CWD: not set (cutile_perf.child.warmstart is started by the harness only)")
    return value


PRELOAD_MAX = 64  # at most this many preloaded modules (CUTILE_PERF_PRELOAD)


def take_preload() -> list[str]:
    """The installed top-level modules a child started ahead of its turn imports while it waits
    (``CUTILE_PERF_PRELOAD``, set by the harness), taken out of the environment; [] when unset."""
    value = os.environ.pop("CUTILE_PERF_PRELOAD", None)
    if not value:
        return []
    try:
        names = json.loads(value)
    except ValueError:
        names = None
    if not (isinstance(names, list) and len(names) <= PRELOAD_MAX
            and all(isinstance(n, str) and n.isidentifier() for n in names)):
        raise BadEnvValue(f"CUTILE_PERF_PRELOAD={value[:80]!r}: expected a JSON list of at most {PRELOAD_MAX} "
                          "top-level module names")
    return names


def pythonpath() -> str:
    return os.environ.get("PYTHONPATH", "")


def set_pythonpath(value: str) -> None:
    """Set this process's PYTHONPATH (inherited by its subprocesses); unset when empty."""
    if value:
        os.environ["PYTHONPATH"] = value
    else:
        os.environ.pop("PYTHONPATH", None)


def take_report_key() -> bytes | None:
    """Read the signing key from ``CUTILE_PERF_KEY_FD`` once and close the descriptor.

    A pipe, not a variable: code imported later in the same process cannot read it back from
    ``os.environ`` or ``/proc/self/environ``.
    """
    fd = _take_fd("CUTILE_PERF_KEY_FD")
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def tune_cache_dir() -> Path:
    value = os.environ.get("CUTILE_PERF_TUNE_CACHE_DIR")
    if value:
        return Path(value)
    # The XDG rule, as cuda-tile applies it to its own cache: no extra dependency for one path.
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cutile-perf" / "tune"


# cutile_perf.bench's timing modes (bench.MODES; listed here because knobs sits below bench).
BENCH_MODES = ("cold", "warm", "graph", "graph-warm", "cupti", "cupti-warm")


def bench_mode() -> str:
    value = os.environ.get("CUTILE_PERF_BENCH_MODE", "cold").strip().lower() or "cold"
    if value not in BENCH_MODES:
        raise BadEnvValue(f"CUTILE_PERF_BENCH_MODE={value!r}: expected one of {', '.join(BENCH_MODES)}")
    return value


def enable_tile() -> str | None:
    """The raw ENABLE_TILE value (None when unset). Only the Triton TileIR build reads it; we report it."""
    return os.environ.get("ENABLE_TILE")


def tileiras_dir_override() -> Path | None:
    """TRITON_TILEIRAS_PATH: the directory where the Triton TileIR backend looks for tileiras first."""
    return _path("TRITON_TILEIRAS_PATH")


def cuda_env_conflicts() -> dict[str, str]:
    """CUDA_ROOT/CUDA_HOME/CUDA_PATH values that would make a pip tileiras pick the wrong libnvvm."""
    return {k: os.environ[k] for k in ("CUDA_ROOT", "CUDA_HOME", "CUDA_PATH") if os.environ.get(k)}


def visible_devices() -> str | None:
    """CUDA_VISIBLE_DEVICES as set (None when unset): the GPUs this node offers its workers (node/gpus.py)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def child_env(**overrides: str) -> dict[str, str]:
    """A copy of the environment for a child process, with ``overrides`` applied."""
    env = dict(os.environ)
    env.update(overrides)
    return env


# The environment of a test child in the sandbox (child/box.py) is built from these names, never
# copied: whatever else the harness's user set (PYTEST_ADDOPTS, PYTEST_PLUGINS, LD_PRELOAD,
# PYTHONSTARTUP, PYTHONHOME, BASH_ENV, tokens, ssh-agent sockets...) does not reach code the kernel
# module runs. The harness adds its own values on top (child/measure.py, child/runner.py,
# pristine.child_env; each in design.md's knob table): PYTHONPATH (the checkout's package roots, then
# the user's own), CUDA_TILE_CACHE_DIR only for the session cache the harness guards (a cache dir of
# the user's own is not passed: the child could plant kernels in it), and HOME/TMPDIR/TMP/TEMP
# pointing at the run's scratch folder.
CHILD_ENV_ALLOWED: dict[str, str] = {
    "PATH": "finding executables the tests and cuda-tile start (tileiras, nvcc, git)",
    "LANG": "text encoding of the child's output", "LANGUAGE": "message language",
    "TERM": "terminal type for pytest's output", "TZ": "timestamps in the output",
    "CUDA_VISIBLE_DEVICES": "which GPU the child uses", "CUDA_DEVICE_ORDER": "how CUDA numbers the GPUs",
    "LD_LIBRARY_PATH": "the driver's and toolkit's shared libraries (containers put libcuda there)",
    "CUDA_HOME": "toolkit root (tileiras)", "CUDA_PATH": "toolkit root (tileiras)", "CUDA_ROOT": "toolkit root (tileiras)",
    "CUDA_TILE_CACHE_SIZE": "cuda-tile cache size", "CUDA_TILE_COMPILER_TIMEOUT_SEC": "cuda-tile: tileiras timeout",
    "CUDA_TILE_LOGS": "cuda-tile: IR dumps to stderr (the output log)",
    "CUDA_TILE_ENABLE_CRASH_DUMP": "cuda-tile: crash bundle on a tileiras error",
    "EXPERIMENTAL_CUDA_TILE_DEBUG_BUILD": "cuda-tile: debug builds, changes what is measured",
    "DISABLE_AUTOTUNE": "cutile_perf.tune: fixed config", "TILEGYM_DISABLE_AUTOTUNE": "TileGym: fixed config",
    "CUTILE_PERF_BENCH_MODE": "timing mode of cutile_perf.bench",
    "CUTILE_MAX_LAUNCH_TIMEOUT_SEC": "TileGym tests: tuning watchdog", "TILEGYM_DISABLE_CUTILE": "TileGym backend switch",
    "CUPTI": "TileGym tests: timing method", "CUDAGRAPH": "TileGym tests: timing method",
    "ENABLE_TILE": "Triton TileIR backend switch", "TILEIR_ENABLE_APPROX": "Triton TileIR: approximate math",
    "TILEIR_ENABLE_FTZ": "Triton TileIR: flush to zero", "TILE_IR_DISABLE_FMAD": "Triton TileIR: no FMA",
    "TILEIR_ENABLE_AUTOGEN_ALIAS_MEM_TOKEN": "Triton TileIR: memory tokens",
    "TRITON_TILEIRAS_PATH": "Triton TileIR: where tileiras is", "TRITON_INTERPRET": "triton CPU interpreter",
    "CUDA_MPS_PIPE_DIRECTORY": "an MPS daemon's pipes, when the GPU is shared through MPS",
}
# Prefixes: locale categories (LC_ALL, LC_CTYPE...), and the NVIDIA container runtime's settings
# (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES) that CUDA inside a container reads.
CHILD_ENV_ALLOWED_PREFIXES: tuple[str, ...] = ("LC_", "NVIDIA_")


def allowed_child_env(**overrides: str) -> dict[str, str]:
    """The environment of a sandboxed child: the allowed names from ours, then ``overrides``."""
    env = {k: v for k, v in os.environ.items()
           if k in CHILD_ENV_ALLOWED or k.startswith(CHILD_ENV_ALLOWED_PREFIXES)}
    env.update(overrides)
    return env


# The variables that change what a child measures without changing the code: timing methods,
# autotune and compiler switches, the import path, and the pytest and loader hooks a child outside
# the sandbox would see. The baseline records their values (``measurement_env``) and every later
# ``try`` and ``verify`` refuses to measure under other values: set at ``try`` (or only at the
# baseline), they would shift every record with no change to the kernel. Not frozen: what only
# finds things (PATH, PYTHONPATH, LD_LIBRARY_PATH, toolkit roots, locale, terminal), which a later
# GPU job may legitimately set differently (the toolchain unpacked elsewhere, the harness run from a
# checkout); the versions every row records say which toolchain measured it.
MEASUREMENT_ENV_NAMES: tuple[str, ...] = (
    "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "LD_PRELOAD",
    "PYTHONSTARTUP", "PYTHONHOME", "PYTHONOPTIMIZE", "PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING", "DISABLE_AUTOTUNE", "TILEGYM_DISABLE_AUTOTUNE", "TILEGYM_DISABLE_CUTILE",
    "CUTILE_PERF_BENCH_MODE", "CUTILE_MAX_LAUNCH_TIMEOUT_SEC", "CUPTI", "CUDAGRAPH", "ENABLE_TILE",
    "EXPERIMENTAL_CUDA_TILE_DEBUG_BUILD",
)
MEASUREMENT_ENV_PREFIXES: tuple[str, ...] = ("CUDA_TILE_", "TILEIR_", "TILE_IR_", "TRITON_")


def search_path_dirs() -> list[str]:
    """The folders on PYTHONPATH, PATH and LD_LIBRARY_PATH (where the toolchain is found)."""
    return [p for name in ("PYTHONPATH", "PATH", "LD_LIBRARY_PATH")
            for p in os.environ.get(name, "").split(os.pathsep) if p]


def measurement_env() -> dict[str, str]:
    """The values of the variables that shape a measurement (``MEASUREMENT_ENV_NAMES``), as set now."""
    return {k: v for k, v in sorted(os.environ.items())
            if (k in MEASUREMENT_ENV_NAMES or k.startswith(MEASUREMENT_ENV_PREFIXES)) and k != "CUDA_TILE_CACHE_DIR"}


def timed_calls_unchecked() -> bool:
    """CUTILE_PERF_UNCHECKED=1: perf children do not check their timed calls (the A/B of what checking
    costs, and the red team's control; never for real decisions)."""
    return os.environ.get("CUTILE_PERF_UNCHECKED") == "1"


def sandbox_override() -> str | None:
    """``"off"`` when CUTILE_PERF_SANDBOX says so; None when unset or ``auto``."""
    value = os.environ.get("CUTILE_PERF_SANDBOX", "").strip().lower()
    if value in ("", "auto"):
        return None
    if value == "off":
        return "off"
    raise BadEnvValue(f"CUTILE_PERF_SANDBOX={value!r}: expected auto or off")


# Test hook (tests/test_redteam.py, tests/test_loop_windows.py): stop the process at a named point
# of the iteration transaction, a step just persisted or a window inside one.
KILL_AT = "CUTILE_PERF_TEST_KILL_AT"
KILL_SIGNAL = "CUTILE_PERF_TEST_SIGNAL"


def kill_point(name: str) -> None:
    """Send ourselves the test's signal when ``CUTILE_PERF_TEST_KILL_AT`` names this point."""
    if os.environ.get(KILL_AT) == name:
        import signal  # noqa: PLC0415 - only in tests

        sig = os.environ.get(KILL_SIGNAL, "KILL").upper()
        os.kill(os.getpid(), getattr(signal, f"SIG{sig}"))
