"""Tunable specs of the bundled ops, for ``cutile-perf probe|ab|prune --target tilesuite.tunables:<op>``.

Each names the op's kernel, its final search space per arch, the fixed config the op launches today,
default shapes, and ``problem(shape)``: inputs allocated once, plus grid and argument functions.
"""
from __future__ import annotations

from cutile_perf.tune import Config
from cutile_perf.tune import spaces
from cutile_perf.tune.tunable import Problem, Tunable


def _rms_norm_space(arch: str) -> list[Config]:
    from tilesuite.ops.cutile import rms_norm as op

    return [Config(TILE_N=op.TILE_N, occupancy=o) for o in spaces.OCCUPANCY_VALUES]


def _rms_norm_problem(shape: dict[str, int]) -> Problem:
    import torch

    from tilesuite.ops.cutile import rms_norm as op

    x = torch.randn(shape["M"], shape["N"], dtype=torch.float16, device="cuda")
    w = torch.randn(shape["N"], dtype=torch.float16, device="cuda")
    out = torch.empty_like(x)
    return Problem(grid_fn=lambda cfg: (x.shape[0],),
                   args_fn=lambda cfg: (x, w, out, 1e-6, cfg.TILE_N))


def _matmul_problem(shape: dict[str, int]) -> Problem:
    import torch

    a = torch.randn(shape["M"], shape["K"], dtype=torch.float16, device="cuda")
    b = torch.randn(shape["K"], shape["N"], dtype=torch.float16, device="cuda")
    c = torch.empty(shape["M"], shape["N"], dtype=torch.float16, device="cuda")
    return Problem(grid_fn=lambda cfg: (-(-shape["M"] // cfg.TILE_M), -(-shape["N"] // cfg.TILE_N), 1),
                   args_fn=lambda cfg: (a, b, c, cfg.TILE_M, cfg.TILE_N, cfg.TILE_K))


def _kernel(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(f"tilesuite.ops.cutile.{module}"), name)



rms_norm = Tunable(
    name="rms_norm",
    kernel=_kernel("rms_norm", "rms_norm_kernel"),
    space=_rms_norm_space,
    fixed=Config(TILE_N=256),  # no hints: what rms_norm() launches today
    shapes=({"M": 262144, "N": 1024}, {"M": 4096, "N": 4096}, {"M": 1024, "N": 8192}),
    problem=_rms_norm_problem,
)

matmul = Tunable(
    name="matmul",
    kernel=_kernel("matmul", "matmul_kernel"),
    space=spaces.matmul_space,
    fixed=Config(TILE_M=64, TILE_N=64, TILE_K=32),  # what matmul() launches today
    shapes=({"M": 4096, "N": 4096, "K": 4096}, {"M": 8192, "N": 8192, "K": 8192}, {"M": 4096, "N": 1024, "K": 4096}),
    problem=_matmul_problem,
)
