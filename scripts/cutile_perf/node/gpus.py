"""The GPUs a node offers its workers, and the refusal of a pool of mixed models.

Which GPUs: ``CUDA_VISIBLE_DEVICES`` when it is set (the user, or Slurm, already chose), else every
GPU ``nvidia-smi`` lists. Names come from ``nvidia-smi`` in both cases (an entry it does not list is
"unknown"). Mixed models are refused: candidates spread over two models would be ranked by the
card they happened to land on (Kernel Tuner refuses such a pool for the same reason).

Everything here is pure but ``smi_listing``; the listing and the variable are passed in, so tests
give their own.
"""
from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from cutile_perf.errors import UsageError

SMI_QUERY = ["nvidia-smi", "--query-gpu=index,name,uuid", "--format=csv,noheader"]
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Gpu:
    """One GPU as a worker sees it: ``device`` is the value its ``CUDA_VISIBLE_DEVICES`` gets."""

    device: str
    name: str
    uuid: str = ""


def parse_smi(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader`` lines as GPUs; lines that
    are not three fields (a driver's warning) are skipped."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[0].isdigit():
            gpus.append(Gpu(device=fields[0], name=fields[1], uuid=fields[2]))
    return gpus


def smi_listing() -> str:
    """What ``nvidia-smi`` lists, or "" where there is none (a CPU machine) or it fails."""
    try:
        done = subprocess.run(SMI_QUERY, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def discover(visible: str | None, listing: str) -> list[Gpu]:
    """The node's GPUs: the ``visible`` entries (``CUDA_VISIBLE_DEVICES``; "" or "-1" is none) when
    set, each named from ``listing`` by index or UUID; else every GPU of ``listing``."""
    listed = parse_smi(listing)
    if visible is None:
        return listed
    by_key = {g.device: g for g in listed} | {g.uuid: g for g in listed if g.uuid}
    gpus = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry or entry.startswith("-"):  # CUDA stops at the first invalid entry
            break
        found = by_key.get(entry)
        gpus.append(Gpu(device=entry, name=found.name if found else UNKNOWN, uuid=found.uuid if found else ""))
    return gpus


def require_one_model(gpus: Sequence[Gpu]) -> None:
    """Refuse a pool of more than one GPU model (an unknown name counts as a model of its own)."""
    models = sorted({g.name for g in gpus})
    if len(models) > 1:
        raise UsageError(f"the GPUs given are of {len(models)} models ({', '.join(models)}); "
                         "a screen ranks on one model only",
                         "set CUDA_VISIBLE_DEVICES to GPUs of one model, or --gpus 1")


def pick(gpus: Sequence[Gpu], wanted: str) -> list[Gpu]:
    """``--gpus N|all`` applied to the node's GPUs, then the one-model check. On a machine without
    a GPU one CPU "worker" (device "") stands in, so ``--gpus 1`` works everywhere."""
    if wanted == "all":
        chosen = list(gpus) or [Gpu(device="", name="cpu")]
    else:
        count = _count(wanted)
        if count > max(1, len(gpus)):
            raise UsageError(f"--gpus {count}: this node offers {len(gpus)} GPU(s)",
                             "use --gpus all, or a smaller count")
        chosen = list(gpus[:count]) or [Gpu(device="", name="cpu")]
    require_one_model(chosen)
    return chosen


def _count(wanted: str) -> int:
    if not wanted.isdigit() or int(wanted) < 1:
        raise UsageError(f"--gpus takes a count of at least 1 or 'all', not {wanted!r}", "e.g. --gpus 4")
    return int(wanted)
