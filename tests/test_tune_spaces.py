"""Space templates: validity rules per arch, <= 8 configs, provisional Hopper marking."""
from __future__ import annotations

import pytest

from cutile_perf.errors import UsageError
from cutile_perf.tune.config import Config
from cutile_perf.tune.spaces import (TEMPLATES, arch_family, attention_space, hint_problems, matmul_space, product,
                                     template, valid)

ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_every_template_is_valid_small_and_nonempty(kind, arch):
    space = template(kind, arch)
    assert 1 <= len(space) <= 8
    assert all(valid(c, arch) for c in space)


def test_arch_families():
    assert [arch_family(a) for a in ARCHS] == ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_100", "sm_120"]
    assert arch_family((9, 0)) == "sm_90" and arch_family("sm_90a") == "sm_90"


def test_hint_rules():
    assert hint_problems(Config(num_ctas=3), "sm_90") == ["num_ctas=3 is not a power of 2 in 1..16"]
    assert hint_problems(Config(num_ctas=2), "sm_80")[0].startswith("num_ctas=2 needs clusters")
    assert hint_problems(Config(num_ctas=2), "sm_120")
    assert hint_problems(Config(num_ctas=16, occupancy=32), "sm_100") == []
    assert hint_problems(Config(occupancy=33), "sm_90") == ["occupancy=33 is outside 1..32"]


def test_smem_filter_drops_tiles_that_cannot_fit():
    big = Config(TILE_M=256, TILE_N=256, TILE_K=128, occupancy=1, num_ctas=1)
    assert not valid(big, "sm_120") and not valid(big, "sm_90")
    assert valid(Config(TILE_M=128, TILE_N=128, TILE_K=64, occupancy=1, num_ctas=1), "sm_120")


def test_hopper_lists_follow_the_h200_measurements():
    hopper = matmul_space("sm_90")
    # Measured best: 128x128x64 with occupancy 2 (matmul step 03), then the probe's winner at occupancy 1.
    assert hopper[:2] == [Config(TILE_M=128, TILE_N=128, TILE_K=64, occupancy=2, num_ctas=1),
                          Config(TILE_M=128, TILE_N=128, TILE_K=64, occupancy=1, num_ctas=1)]
    # 128x256x64 on two consumer warpgroups: 93.6-95.9 % of cuBLAS in benchmarks/matmul_sweep.py (no spill).
    assert Config(TILE_M=128, TILE_N=256, TILE_K=64, occupancy=1, num_ctas=1, num_worker_warps=8) in hopper
    for slow in [(256, 256, 2), (128, 256, 1), (256, 256, 1), (256, 128, 1)]:  # 8-30x slower on the H200
        m, n, ctas = slow
        assert Config(TILE_M=m, TILE_N=n, TILE_K=64, occupancy=1, num_ctas=ctas) not in hopper
    assert {(c.TILE_M, c.TILE_N) for c in attention_space("sm_90")} >= {(128, 128), (128, 64)}  # attention step 03


def test_product_and_unknown_kind():
    assert product(a=(1, 2), b=("x",)) == [Config(a=1, b="x"), Config(a=2, b="x")]
    with pytest.raises(UsageError, match="known: elementwise"):
        template("conv", "sm_90")
