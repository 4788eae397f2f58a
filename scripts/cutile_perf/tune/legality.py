"""Legality pruning before anything compiles: rules that drop configs from a space with a reason.

A config is dropped when it cannot compile or cannot be competitive for a reason known before
compiling. Each rule is conservative and says where its threshold comes from:

* hints: ``num_ctas`` a power of 2 in 1..16 and only where clusters exist, ``occupancy`` 1..32
  (``spaces.hint_problems``; cuTile's ``ct.kernel`` docstring).
* tile shape: every ``TILE_*``/``BLOCK_*`` field a power of 2 (cuTile tile shapes must be; a
  48-wide tile fails to compile, ``tests/tune_kernels.py:broken_kernel``).
* tile vs problem (``dims``, field -> extent): a tile larger than the extent rounded up to a power
  of 2 only adds padding; with ``divisible=True`` (kernels that do not pad) a tile must divide it.
* shared memory: double-buffered A and B tiles of a GEMM over the per-CTA opt-in maximum
  (``spaces.gemm_smem_bytes``; CUDA programming guide, technical specifications).
* registers: on sm_90 a GEMM whose fp32 accumulator per CTA, ``TILE_M*TILE_N/num_ctas``, is
  over 128x128 spills. Measured with ``cutile-perf probe`` (``cutile_perf/tune/spaces.py`` header;
  the figures: ``references/h200-measurements.md``, "Probe: matmul tile sizes and num_ctas"): such
  tiles with one CTA ran several times slower than 128x128, while the same tiles split over two
  CTAs ran close to it.
  No rule where nothing was measured (other archs), or when ``num_worker_warps`` > 4 adds registers.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cutile_perf.tune.config import Config
from cutile_perf.tune.keys import pow2_bucket
from cutile_perf.tune.spaces import SMEM_PER_CTA, arch_family, gemm_smem_bytes, hint_problems

# Largest fp32 accumulator per CTA (elements) that did not spill, by arch family; measured only on sm_90.
ACCUMULATOR_LIMIT = {"sm_90": 128 * 128}


@dataclass(frozen=True)
class Dropped:
    config: Config
    reason: str


def _tile_fields(cfg: Config) -> dict[str, int]:
    return {k: v for k, v in cfg.items()
            if isinstance(v, int) and not isinstance(v, bool) and k.upper().startswith(("TILE", "BLOCK"))}


def problems(cfg: Config, *, arch: str, dims: Mapping[str, int] | None = None, elem_bytes: int = 2,
             divisible: bool = False) -> list[str]:
    """Why ``cfg`` should not be compiled for ``arch`` and ``dims`` (empty: keep it)."""
    found = list(hint_problems(cfg, arch))
    tiles = _tile_fields(cfg)
    for name, value in tiles.items():
        if value < 1 or value & (value - 1):
            found.append(f"{name}={value} is not a power of 2")
            continue
        extent = (dims or {}).get(name)
        if extent is None:
            continue
        if value > pow2_bucket(extent):
            found.append(f"{name}={value} > {extent} rounded up to {pow2_bucket(extent)}: padding only")
        elif divisible and extent % value:
            found.append(f"{name}={value} does not divide {extent}")
    family = arch_family(arch)
    if {"TILE_M", "TILE_N", "TILE_K"} <= set(tiles):
        smem = gemm_smem_bytes(cfg, elem_bytes=elem_bytes)
        if smem > SMEM_PER_CTA[family]:
            found.append(f"A+B tiles need {smem // 1024} KB of shared memory > {SMEM_PER_CTA[family] // 1024} KB per CTA")
    limit = ACCUMULATOR_LIMIT.get(family)
    if limit and {"TILE_M", "TILE_N"} <= set(tiles) and (cfg.get("num_worker_warps") or 4) <= 4:
        per_cta = tiles["TILE_M"] * tiles["TILE_N"] // max(1, cfg.get("num_ctas") or 1)
        if per_cta > limit:
            found.append(f"accumulator {per_cta} fp32 per CTA > {limit}: spills on {family} (measured 8-30x slower)")
    return found


def prune(space: Iterable[Config], *, arch: str, dims: Mapping[str, int] | None = None, elem_bytes: int = 2,
          divisible: bool = False, keep: Iterable[Config] = ()) -> tuple[list[Config], list[Dropped]]:
    """(kept, dropped) in the space's order; configs in ``keep`` (the fixed config) are never dropped."""
    must = set(keep)
    kept: list[Config] = []
    dropped: list[Dropped] = []
    for cfg in space:
        why = [] if cfg in must else problems(cfg, arch=arch, dims=dims, elem_bytes=elem_bytes, divisible=divisible)
        if why:
            dropped.append(Dropped(cfg, "; ".join(why)))
        else:
            kept.append(cfg)
    return kept, dropped
