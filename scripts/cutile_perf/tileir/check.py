"""Is the Triton TileIR backend usable here? A probe that never raises.

Each probe returns plain data and turns every failure into a value with the reason, because this
runs on CPU CI, on GPUs without the TileIR build, and on broken installs (a failed import of triton
can raise far more than ImportError, and ``triton.runtime.driver.active`` raises RuntimeError
when no GPU driver is active).
"""
from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
from pathlib import Path
from typing import Any

from cutile_perf.child import envcheck
from cutile_perf import knobs

# First tileiras release that can target each compute capability major (CUDA Tile IR release notes:
# 13.1 Blackwell only, 13.2 adds Ampere/Ada, 13.3 adds Hopper; see references/triton-tileir.md).
_TILEIRAS_MIN_RELEASE_BY_MAJOR: dict[int, tuple[int, int]] = {8: (13, 2), 9: (13, 3), 10: (13, 1), 12: (13, 1)}


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def triton_package() -> dict[str, Any]:
    """Name, version and path of the package that ``import triton`` loads, or why it does not load."""
    info: dict[str, Any] = {"importable": False, "version": None, "path": None, "distribution": None, "error": None}
    try:
        triton = importlib.import_module("triton")
    except (Exception, SystemExit) as exc:  # a broken install may raise anything, even SystemExit
        info["error"] = _reason(exc)
        return info
    info["importable"] = True
    info["version"] = getattr(triton, "__version__", None)
    path = getattr(triton, "__file__", None)
    info["path"] = str(Path(path).parent) if path else None
    info["distribution"] = _distribution_of(info["path"])
    return info


def _distribution_of(package_dir: str | None) -> str | None:
    """Which installed distribution ships ``triton`` (triton, nvtriton, triton_tileir, pytorch-triton...)."""
    if not package_dir:
        return None
    try:
        from importlib import metadata

        for dist in metadata.distributions():
            files = dist.files or []
            if any(str(f).startswith("triton/__init__.py") for f in files):
                located = Path(dist.locate_file("triton")).resolve()
                if located == Path(package_dir).resolve():
                    return dist.metadata["Name"]
    except Exception:  # metadata is informative only
        return None
    return None


def tileir_backend_module() -> dict[str, Any]:
    """Whether the TileIR backend package (``triton.backends.tileir``) exists in the active triton."""
    try:
        found = importlib.util.find_spec("triton.backends.tileir") is not None
        return {"present": found, "error": None}
    except (Exception, SystemExit) as exc:  # find_spec imports the parents, which may be broken
        return {"present": False, "error": _reason(exc)}


def active_target() -> dict[str, Any]:
    """The target of the active Triton driver: the real test of which backend compiles kernels."""
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
        return {"backend": getattr(target, "backend", None), "arch": getattr(target, "arch", None), "error": None}
    except (Exception, SystemExit) as exc:  # "0 active drivers" without a GPU is a RuntimeError
        return {"backend": None, "arch": None, "error": _reason(exc)}


def gpu() -> dict[str, Any]:
    """Name and compute capability of GPU 0 as torch sees it (``envcheck.torch_gpu``); nulls without one."""
    _version, name, cc, problem = envcheck.torch_gpu()
    capability = [int(x) for x in cc.split(".")] if cc else None
    return {"name": name, "capability": capability, "error": problem}


def tileiras_candidates(triton_dir: str | None) -> list[tuple[str, Path]]:
    """Where the Triton TileIR backend looks for tileiras, in its order, then the pip package cuTile uses."""
    candidates: list[tuple[str, Path]] = []
    override = knobs.tileiras_dir_override()
    if override is not None:
        candidates.append(("TRITON_TILEIRAS_PATH", override / "tileiras"))
    if triton_dir:
        candidates.append(("bundled with triton", Path(triton_dir) / "backends" / "nvidia" / "bin" / "tileiras"))
    on_path = shutil.which("tileiras")
    if on_path:
        candidates.append(("PATH", Path(on_path)))
    try:
        spec = importlib.util.find_spec("nvidia")
        for root in list(spec.submodule_search_locations or []) if spec else []:
            candidates.append(("nvidia-cuda-tileiras pip package", Path(root) / "cu13" / "bin" / "tileiras"))
    except (Exception, SystemExit):  # an optional location
        pass
    return candidates


def tileiras(triton_dir: str | None) -> dict[str, Any]:
    """The first tileiras found and its release; ``found`` false with the places searched otherwise."""
    searched = []
    for source, path in tileiras_candidates(triton_dir):
        searched.append(str(path))
        if not path.is_file():
            continue
        info: dict[str, Any] = {"found": True, "path": str(path), "source": source, "version": None, "error": None,
                                # The pip copy serves cuTile; the Triton TileIR build does not search there.
                                "searched_by_triton_tileir": source != "nvidia-cuda-tileiras pip package"}
        try:
            release = envcheck.parse_tileiras_release(envcheck.tileiras_version_text(path, timeout_s=30))
            info["version"] = f"{release[0]}.{release[1]}" if release else None
        except (OSError, subprocess.SubprocessError) as exc:
            info["error"] = _reason(exc)
        return info
    return {"found": False, "path": None, "source": None, "version": None, "error": None, "searched": searched}


def tileiras_supports(version: str | None, capability: list[int] | None) -> bool | None:
    """Can this tileiras release target this GPU? None when either is unknown."""
    if not version or not capability:
        return None
    release = envcheck.parse_tileiras_release(f"release {version}")
    minimum = _TILEIRAS_MIN_RELEASE_BY_MAJOR.get(capability[0])
    if release is None or minimum is None:
        return False if release is not None else None
    return release >= minimum


def recommendation(report: dict[str, Any]) -> str:
    """One sentence: what to do next, derived only from what was probed."""
    if not report["triton"]["importable"]:
        return "triton does not import: install triton (or repair it) before anything else"
    if report["tileir_active"]:
        return "TileIR backend active: verify with ENABLE_TILE=1, then benchmark against ENABLE_TILE=0"
    if report["tileir_backend_installed"]:
        if report["enable_tile"] != "1":
            return "TileIR build installed but not selected: set ENABLE_TILE=1 before triton is imported"
        return "TileIR build installed and ENABLE_TILE=1, but the active target is not tileir: " + (
            report["active_target"]["error"] or "check the GPU and the tileiras version")
    if report["enable_tile"] == "1":
        return ("ENABLE_TILE=1 has no effect: this triton has no TileIR backend; install the TileIR build side by "
                "side (see references/triton-tileir.md)")
    return ("standard triton (PTX backend): classify kernels and add gated TileIR configs; the TileIR path "
            "cannot be validated here")


def check() -> dict[str, Any]:
    """Everything ``cutile-perf tileir-check`` reports, as JSON-ready data."""
    triton_info = triton_package()
    backend = tileir_backend_module() if triton_info["importable"] else {"present": False, "error": None}
    target = active_target() if triton_info["importable"] else {"backend": None, "arch": None, "error": None}
    gpu_info = gpu()
    tool = tileiras(triton_info["path"])
    report: dict[str, Any] = {
        "triton": triton_info,
        "tileir_backend_installed": backend["present"],
        "tileir_backend_error": backend["error"],
        "active_target": target,
        "tileir_active": target["backend"] == "tileir",
        "enable_tile": knobs.enable_tile(),
        "gpu": gpu_info,
        "gpu_capability": gpu_info["capability"],
        # Blackwell is what the TileIR backend was validated on publicly (B200, RTX PRO 6000).
        "blackwell_gpu": None if gpu_info["capability"] is None else gpu_info["capability"][0] in (10, 12),
        "tileiras": tool,
        "tileiras_supports_gpu": tileiras_supports(tool["version"], gpu_info["capability"]),
    }
    report["ready"] = bool(report["tileir_active"])
    report["recommendation"] = recommendation(report)
    return report
