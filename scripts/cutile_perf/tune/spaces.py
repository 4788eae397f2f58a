"""Search-space templates by kernel type and architecture, with validity filters.

Kernel types (TileGym's decision tree): memory-bound and balanced kernels (elementwise, norms,
reductions) tune occupancy only; matmul tunes TILE_M x TILE_N x TILE_K x occupancy x num_ctas;
attention TILE_M x TILE_N x num_ctas; fused multi-GEMM uses conservative tiles and low occupancy.

Where the lists come from. sm_90 matmul and attention are MEASURED on a GPU (each list's comment
says which entries; the figures and the commands that produced them: ``references/h200-measurements.md``,
"Probe: matmul tile sizes and num_ctas", "Matmul sweep" and "Attention prepared steps"); the sm_90
fused-GEMM list is still a guess (marked PROVISIONAL below); other archs carry TileGym's per-arch
choices or conservative guesses, none measured by us.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable

from cutile_perf.tune.config import Config
from cutile_perf.errors import UsageError

# Shared memory a single CTA may use (opt-in maximum, bytes) and per SM, by arch family.
SMEM_PER_CTA = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90": 227 * 1024,
                "sm_100": 227 * 1024, "sm_120": 99 * 1024}
CLUSTER_ARCHS = {"sm_90", "sm_100"}  # thread-block clusters (num_ctas > 1); sm_120 and pre-Hopper: no

OCCUPANCY_VALUES = (1, 2, 4, 8)


def arch_family(cc: tuple[int, int] | str) -> str:
    """sm_80/sm_86/sm_89 (Ampere/Ada), sm_90 (Hopper), sm_100 (datacenter Blackwell, incl. 103/110), sm_120."""
    if isinstance(cc, str):
        digits = cc.removeprefix("sm_").rstrip("a")
        cc = (int(digits[:-1]), int(digits[-1]))
    major, minor = cc
    if major < 9:
        return {(8, 6): "sm_86", (8, 7): "sm_86", (8, 9): "sm_89"}.get((major, minor), "sm_80")
    if major == 9:
        return "sm_90"
    if major == 12:
        return "sm_120"
    return "sm_100"


def hint_problems(cfg: Config, arch: str) -> list[str]:
    """Why ``cfg``'s hints are invalid on ``arch`` (empty when valid)."""
    problems = []
    ctas = cfg.get("num_ctas")
    if ctas is not None and (ctas not in (1, 2, 4, 8, 16)):
        problems.append(f"num_ctas={ctas} is not a power of 2 in 1..16")
    elif ctas is not None and ctas > 1 and arch_family(arch) not in CLUSTER_ARCHS:
        problems.append(f"num_ctas={ctas} needs clusters (sm_90/sm_100), not {arch}")
    occ = cfg.get("occupancy")
    if occ is not None and not (isinstance(occ, int) and 1 <= occ <= 32):
        problems.append(f"occupancy={occ} is outside 1..32")
    return problems


def gemm_smem_bytes(cfg: Config, *, elem_bytes: int = 2, stages: int = 2) -> int:
    """Shared memory of double-buffered A and B tiles: a lower bound of what the compiler allocates."""
    return stages * elem_bytes * (cfg["TILE_M"] * cfg["TILE_K"] + cfg["TILE_K"] * cfg["TILE_N"])


def valid(cfg: Config, arch: str, *, elem_bytes: int = 2) -> bool:
    if hint_problems(cfg, arch):
        return False
    if {"TILE_M", "TILE_N", "TILE_K"} <= set(cfg):
        return gemm_smem_bytes(cfg, elem_bytes=elem_bytes) <= SMEM_PER_CTA[arch_family(arch)]
    return True


def filter_valid(configs: Iterable[Config], arch: str, **kw) -> list[Config]:
    return [c for c in configs if valid(c, arch, **kw)]


def product(**axes: Iterable) -> list[Config]:
    """Cartesian product of named axes, in the given order."""
    names = list(axes)
    return [Config(dict(zip(names, values))) for values in itertools.product(*(list(v) for v in axes.values()))]


def occupancy_space(values: Iterable[int] = OCCUPANCY_VALUES) -> list[Config]:
    """Elementwise, norms, reductions, persistent kernels with fixed block sizes."""
    return [Config(occupancy=o) for o in values]


def _tiles(rows, arch):
    """Configs from (TILE_M, TILE_N, TILE_K, occupancy, num_ctas[, num_worker_warps]) rows; the
    warps field only where a row gives it (absent: the compiler's choice)."""
    return filter_valid([Config(TILE_M=r[0], TILE_N=r[1], TILE_K=r[2], occupancy=r[3], num_ctas=r[4],
                                **({"num_worker_warps": r[5]} if len(r) > 5 else {})) for r in rows], arch)


# (TILE_M, TILE_N, TILE_K, occupancy, num_ctas[, num_worker_warps]); <= 8 per arch.
MATMUL = {
    "sm_80": [(64, 64, 32, 1, 1), (128, 128, 32, 1, 1), (128, 64, 32, 2, 1), (64, 128, 64, 1, 1)],
    "sm_86": [(64, 64, 32, 1, 1), (128, 64, 32, 1, 1), (64, 128, 32, 1, 1), (128, 128, 32, 1, 1)],
    "sm_89": [(64, 64, 32, 1, 1), (128, 64, 32, 1, 1), (64, 128, 32, 1, 1), (128, 128, 32, 1, 1)],
    # MEASURED unless marked (references/h200-measurements.md, "Probe: matmul tile sizes and
    # num_ctas" and "Matmul sweep"): 128x128x64 occupancy 2 is matmul step 03; the next entries
    # follow the probe's ranking. Left out as measured losers, several times slower: 256x128 nc1,
    # 256x256 nc2, 128x256 nc1, 256x256 nc1 (256x256 nc2 spills on sm_90, see matmul step 05).
    # 128x256x64 with num_worker_warps=8 (two consumer warpgroups) does not spill and timed faster
    # than step 03 in the same sweep, without a latency hint (this space's kernels have none); with
    # latency=10 it is matmul step 07.
    "sm_90": [(128, 128, 64, 2, 1), (128, 128, 64, 1, 1), (128, 256, 64, 1, 1, 8),
              (256, 128, 64, 1, 2), (128, 256, 64, 1, 2),
              (64, 256, 64, 1, 1),
              (64, 128, 64, 1, 1),  # measured slower at 4096^3+; kept for small problems (fewer tiles than SMs)
              (64, 256, 64, 2, 1)],  # NOT measured: occupancy 2 on the 4th-ranked tile (same accumulator size as 128x128)
    "sm_100": [(128, 128, 32, 1, 1), (256, 256, 64, 1, 2), (256, 256, 64, 1, 4), (512, 256, 64, 1, 2),
               (128, 256, 64, 1, 1), (128, 128, 64, 1, 2)],
    "sm_120": [(64, 64, 32, 1, 1), (128, 64, 64, 1, 1), (64, 128, 64, 1, 1), (128, 128, 32, 1, 1)],
}

# (TILE_M, TILE_N, num_ctas)
ATTENTION = {
    "sm_80": [(64, 64, 1), (128, 64, 1), (64, 32, 1)],
    "sm_86": [(64, 64, 1), (128, 64, 1), (64, 32, 1)],
    "sm_89": [(64, 64, 1), (128, 64, 1), (64, 32, 1)],
    # MEASURED (attention step 03; references/h200-measurements.md, "Attention prepared steps"):
    # 128x128 is the best tile for D=64 and 128x64 for D=128 (128x128 spills at D=128); 64x64 is
    # the plain version.
    # 128x64 num_ctas=2 is NOT measured. The space has no head-dim field: key the tuner on D.
    "sm_90": [(128, 64, 1), (128, 128, 1), (64, 64, 1), (128, 64, 2)],
    "sm_100": [(128, 128, 1), (256, 128, 1), (128, 128, 2), (256, 128, 2)],
    "sm_120": [(64, 64, 1), (128, 64, 1)],
}

# Fused multi-GEMM (dual GEMM, GEMM + GLU): twice the register and smem pressure.
FUSED_GEMM = {
    "sm_80": [(64, 64, 32, 1, 1), (64, 128, 32, 1, 1)],
    "sm_86": [(64, 64, 32, 1, 1), (64, 128, 32, 1, 1)],
    "sm_89": [(64, 64, 32, 1, 1), (64, 128, 32, 1, 1)],
    "sm_90": [(64, 128, 64, 1, 1), (128, 64, 64, 1, 1), (64, 64, 64, 2, 1), (128, 128, 32, 1, 1)],  # PROVISIONAL
    "sm_100": [(128, 128, 64, 1, 1), (128, 128, 64, 1, 2), (128, 256, 64, 1, 2)],
    "sm_120": [(64, 64, 32, 1, 1), (64, 128, 32, 1, 1)],
}


def matmul_space(arch: str) -> list[Config]:
    return _tiles(MATMUL[arch_family(arch)], arch)


def fused_gemm_space(arch: str) -> list[Config]:
    return _tiles(FUSED_GEMM[arch_family(arch)], arch)


def attention_space(arch: str) -> list[Config]:
    return filter_valid([Config(TILE_M=m, TILE_N=n, num_ctas=c) for m, n, c in ATTENTION[arch_family(arch)]], arch)


TEMPLATES = {
    "elementwise": lambda arch: occupancy_space(),
    "norm": lambda arch: occupancy_space(),
    "reduction": lambda arch: occupancy_space(),
    "matmul": matmul_space,
    "attention": attention_space,
    "fused_gemm": fused_gemm_space,
}


def template(kind: str, arch: str) -> list[Config]:

    try:
        return TEMPLATES[kind](arch)
    except KeyError:
        raise UsageError(f"unknown kernel type {kind!r}; known: {', '.join(TEMPLATES)}") from None
