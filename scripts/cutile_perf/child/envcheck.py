"""What machine and toolchain a measurement ran on, and what is missing to run cuTile at all.

Never raises: each probe that fails becomes a ``Problem`` with a message saying what to do.
Probes are cheap (``nvidia-smi`` and package metadata; torch is imported only as a fallback when
``nvidia-smi`` is absent), so ``snapshot()`` can be recorded with every iteration. A loop command
starts one ``Probe`` at its first line: it runs in a background thread while git and pytest work,
and its one result serves both the GPU gate and the log entry.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cutile_perf import knobs

# cuTile needs compute capability 8.0+; tileiras below 13.3 cannot target Hopper (sm_90).
MIN_COMPUTE_CAPABILITY = (8, 0)
_SMI_TIMEOUT_S = 10.0
GPU_PROBLEMS = ("gpu", "compute capability")

# The toolchain pins of pyproject.toml's `gpu` extra, the one source of every install hint
# (tests/test_envcheck.py checks them against pyproject.toml). cuda-tile's own `tileiras` extra
# allows tileiras 13.2, which cannot target Hopper, and goes through `cuda-toolkit`, which torch's
# CUDA wheels pin to their own release: the component packages pinned to 13.4 avoid both (issue 43).
TOOLCHAIN_REQUIREMENTS = ("cuda-tile>=1.7", "nvidia-cuda-tileiras>=13.4,<13.5", "nvidia-cuda-nvcc>=13.4,<13.5",
                          "nvidia-nvvm>=13.4,<13.5")
INSTALL_HINT = "pip install " + " ".join(f"'{req}'" for req in TOOLCHAIN_REQUIREMENTS)
# The torch of the same extra: the base install has none, and a target's tests import it.
TORCH_REQUIREMENT = "torch>=2.11"
TORCH_INSTALL_HINT = f"pip install '{TORCH_REQUIREMENT}'"


@dataclass(frozen=True)
class Problem:
    what: str
    message: str
    fatal_for_measuring: bool = True


@dataclass(frozen=True)
class Environment:
    gpu: str | None = None
    compute_capability: str | None = None  # "9.0"
    driver: str | None = None
    cuda_tile: str | None = None
    tileiras: str | None = None
    torch: str | None = None
    cuda_env: dict[str, str] = field(default_factory=dict)
    problems: tuple[Problem, ...] = ()

    @property
    def can_measure(self) -> bool:
        return not any(p.fatal_for_measuring for p in self.problems)

    @property
    def gpu_problems(self) -> tuple[Problem, ...]:
        """The problems that mean no usable GPU (absent, or below the compute capability cuTile needs)."""
        return tuple(p for p in self.problems if p.what in GPU_PROBLEMS)

    def record(self) -> dict:
        """The fields stored with every log entry (no problems, which belong to the check)."""
        data = asdict(self)
        data.pop("problems")
        return data


def _package_version(*names: str) -> str | None:
    import importlib.metadata  # lazy: ~10 ms that `--help` and most commands never need

    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        except Exception:  # a corrupt dist-info must not crash the check
            continue
    return None


def parse_tileiras_release(text: str) -> tuple[int, int] | None:
    """``(13, 4)`` from ``tileiras --version`` output ("... release 13.4, V13.4.92"), or None."""
    match = re.search(r"release (\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def tileiras_version_text(binary: str | Path, timeout_s: float = _SMI_TIMEOUT_S) -> str:
    """The output of ``<binary> --version``; raises OSError / SubprocessError when it cannot run."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=timeout_s)
    return out.stdout + out.stderr


def _tileiras_version() -> str | None:
    pip_version = _package_version("nvidia-cuda-tileiras")
    if pip_version:
        return pip_version
    binary = shutil.which("tileiras")
    if not binary:
        return None
    try:
        out = tileiras_version_text(binary)
    except (OSError, subprocess.SubprocessError):
        return None
    # The last "release X.Y" style token is the version; keep the whole line when the format is unknown.
    for line in reversed(out.splitlines()):
        if "release" in line.lower() or "version" in line.lower():
            return line.strip()
    return out.strip().splitlines()[-1] if out.strip() else None


def _nvidia_smi() -> tuple[str | None, str | None, str | None]:
    """(gpu name, compute capability, driver) of GPU 0 from nvidia-smi, or Nones."""
    binary = shutil.which("nvidia-smi")
    if not binary:
        return None, None, None
    # Old drivers do not know compute_cap: asked again without it.
    for fields in (("name", "compute_cap", "driver_version"), ("name", "driver_version")):
        try:
            proc = subprocess.run([binary, "--query-gpu=" + ",".join(fields), "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=_SMI_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return None, None, None
        if proc.stdout.strip() and (proc.returncode == 0 or len(fields) == 2):
            parts = [p.strip() for p in proc.stdout.splitlines()[0].split(",")]
            if len(parts) != len(fields):
                return None, None, None
            found = dict(zip(fields, parts))
            return found["name"], found.get("compute_cap"), found["driver_version"]
    return None, None, None


def torch_gpu() -> tuple[str | None, str | None, str | None, str | None]:
    """(torch version, gpu name, compute capability, problem) through torch."""
    try:
        import torch
    except Exception as exc:
        return None, None, None, f"torch is not importable ({type(exc).__name__})"
    try:
        if not torch.cuda.is_available():
            return torch.__version__, None, None, "torch sees no CUDA GPU"
        major, minor = torch.cuda.get_device_capability(0)
        return torch.__version__, torch.cuda.get_device_name(0), f"{major}.{minor}", None
    except Exception as exc:
        return torch.__version__, None, None, f"torch CUDA query failed ({type(exc).__name__}: {exc})"


def _cc_tuple(cc: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (cc or "").split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def check(*, with_torch: bool = True) -> Environment:
    """Probe everything; ``with_torch=False`` skips the slow torch import (used per iteration)."""
    problems: list[Problem] = []
    gpu, cc, driver = _nvidia_smi()
    torch_version = None
    if with_torch:
        torch_version, torch_name, torch_cc, torch_problem = torch_gpu()
        gpu, cc = gpu or torch_name, cc or torch_cc
        if torch_version is None:
            problems.append(Problem("torch", f"{torch_problem}: install a CUDA build of torch: {TORCH_INSTALL_HINT}"))
    if gpu is None:
        problems.append(Problem("gpu", "no NVIDIA GPU found (nvidia-smi absent or failing, torch sees no GPU): "
                                       "run the loop on a GPU machine"))
    cc_value = _cc_tuple(cc)
    if cc_value is not None and cc_value < MIN_COMPUTE_CAPABILITY:
        problems.append(Problem("compute capability", f"compute capability {cc} is below 8.0; cuTile needs Ampere or newer"))
    cuda_tile = _package_version("cuda-tile", "cuda_tile")
    if cuda_tile is None:
        problems.append(Problem("cuda-tile", f"cuda-tile is not installed: {INSTALL_HINT}"))
    tileiras = _tileiras_version()
    if tileiras is None:
        problems.append(Problem("tileiras", "tileiras not found (no nvidia-cuda-tileiras package, none on PATH): "
                                            + INSTALL_HINT))
    conflicts = knobs.cuda_env_conflicts()
    if conflicts and _package_version("nvidia-cuda-tileiras"):
        names = ", ".join(f"{k}={v}" for k, v in sorted(conflicts.items()))
        problems.append(Problem("cuda env", f"{names} is set while tileiras comes from pip; a mismatched toolkit can "
                                            "break compilation: unset it unless it matches tileiras",
                                fatal_for_measuring=False))
    return Environment(gpu=gpu, compute_capability=cc, driver=driver, cuda_tile=cuda_tile, tileiras=tileiras,
                       torch=torch_version, cuda_env=conflicts, problems=tuple(problems))


def snapshot() -> dict:
    """The environment fields stored with a log entry; fast, no torch import."""
    return check(with_torch=False).record()


class Probe:
    """``check(with_torch=False)`` run once for one command, in a background thread.

    Started at the command's first line, it overlaps ``nvidia-smi`` and the package look-ups with
    session loading, git and the pytest children; ``result()`` waits for it (or runs it inline when
    ``background=False``). One object per command, never a process-wide cache: a long-lived process
    (the test suite, the demo) must see the machine as it is when each command runs.
    """

    def __init__(self, *, background: bool = True):
        self._env: Environment | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="cutile-perf-envcheck", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._env = check(with_torch=False)
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._error = exc

    def result(self) -> Environment:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        elif self._env is None and self._error is None:
            self._run()
        if self._error is not None:
            raise self._error
        return self._env


def versions_line() -> str:
    """One line for bug reports: GPU, driver, cuda-tile and tileiras versions."""
    try:
        env = check(with_torch=False)
        return (f"gpu={env.gpu or 'none'} cc={env.compute_capability or '?'} driver={env.driver or '?'} "
                f"cuda-tile={env.cuda_tile or 'missing'} tileiras={env.tileiras or 'missing'}")
    except Exception as exc:  # called from the error handler: it must never raise
        return f"versions unavailable ({type(exc).__name__})"


def render(env: Environment) -> str:
    """A short human report: one line per fact, then one line per problem."""
    lines = [
        f"GPU: {env.gpu or 'none found'}" + (f" (compute capability {env.compute_capability})"
                                             if env.compute_capability else ""),
        f"driver: {env.driver or 'unknown'}",
        f"cuda-tile: {env.cuda_tile or 'missing'}",
        f"tileiras: {env.tileiras or 'missing'}",
    ]
    if env.torch:
        lines.append(f"torch: {env.torch}")
    for problem in env.problems:
        kind = "error" if problem.fatal_for_measuring else "warning"
        lines.append(f"{kind}: {problem.message}")
    if not env.problems:
        lines.append("ready to measure")
    return "\n".join(lines)
