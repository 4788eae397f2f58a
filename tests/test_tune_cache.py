"""Persistent tuning cache: keys, persistence across tuners, staleness, corruption, concurrent writers."""
from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest

from cutile_perf.tune import Autotuner, Config, DeviceInfo, FakeBench
from cutile_perf.tune.cache import TuneCache
from cutile_perf.tune.config import Trial
from cutile_perf.tune.keys import persistent_key, persistent_key_parts
from tests.test_tune_autotuner import OCC, FakeKernel, FakeLauncher

H200 = DeviceInfo("FAKE H200", (9, 0))
VERSIONS = {"cuda_tile": "1.7.0", "tileiras": "13.4"}


def parts(**over):
    base = dict(kernel_src="abc", key=((4096, 4096), "torch.float16", 0), device=H200, versions=VERSIONS, space=OCC)
    base.update(over)
    return persistent_key_parts(**base)


def test_key_changes_with_everything_that_changes_the_answer():
    ref = persistent_key(parts())
    variants = [parts(kernel_src="abd"), parts(key=((4096, 2048), "torch.float16", 0)),
                parts(device=DeviceInfo("NVIDIA B200", (10, 0))), parts(device=DeviceInfo("FAKE H200", (9, 1))),
                parts(versions={**VERSIONS, "tileiras": "13.5"}), parts(versions={**VERSIONS, "cuda_tile": "1.8.0"}),
                parts(space=OCC[:3]), parts(space=list(reversed(OCC)))]
    keys = {persistent_key(p) for p in variants}
    assert ref not in keys and len(keys) == len(variants)
    assert persistent_key(parts()) == ref  # deterministic across calls (never built from __str__ of objects)


def _tuner(tmp_path, times):
    return Autotuner(FakeKernel(), OCC, fixed=OCC[0], timer=FakeBench(times), precompile=None,
                     cache_dir=tmp_path, device=H200, launcher=FakeLauncher())


def _tune(tuner, key="k"):
    x = np.zeros(1)
    return tuner.tune(key, 0, lambda c: (1,), lambda c: (x,))


def test_second_tuner_loads_from_disk_without_timing(tmp_path, monkeypatch):
    monkeypatch.setattr("cutile_perf.tune.keys.toolchain_versions", lambda: VERSIONS)
    first = _tuner(tmp_path, {c: 1.0 / c.occupancy for c in OCC})
    assert _tune(first).config == Config(occupancy=8)
    second = _tuner(tmp_path, {c: 1.0 for c in OCC})  # another process, in effect
    assert _tune(second).config == Config(occupancy=8)
    assert second.timer.timed == [] and second.reports["k"].source == "disk"
    assert second.reports["k"].compiled == 0 and second.reports["k"].timed == 0


def test_stale_entry_is_never_found_after_the_space_changes(tmp_path, monkeypatch):
    monkeypatch.setattr("cutile_perf.tune.keys.toolchain_versions", lambda: VERSIONS)
    _tune(_tuner(tmp_path, {c: 1.0 / c.occupancy for c in OCC}))
    smaller = Autotuner(FakeKernel(), OCC[:3], fixed=OCC[0], timer=FakeBench({c: 1.0 for c in OCC}),
                        precompile=None, cache_dir=tmp_path, device=H200, launcher=FakeLauncher())
    _tune(smaller)
    assert smaller.reports["k"].source == "search"


def test_entry_whose_config_left_the_space_is_ignored(tmp_path):
    cache = TuneCache(tmp_path)
    p = parts()
    cache.store("k1", p, Config(occupancy=16), [])
    assert cache.load("k1", p, OCC) is None
    assert cache.load("k1", p) is not None


def test_entry_with_other_parts_is_ignored(tmp_path):
    cache = TuneCache(tmp_path)
    cache.store("k1", parts(), OCC[1], [Trial(OCC[1], (0.5,))])
    assert cache.load("k1", parts(kernel_src="other"), OCC) is None
    loaded = cache.load("k1", parts(), OCC)
    assert loaded.config == OCC[1] and loaded.trials == (Trial(OCC[1], (0.5,)),)


@pytest.mark.parametrize("content", ["", "{", "[]", '{"schema": 1}', '{"schema": 1, "parts": null}', "\x00\xff"])
def test_corrupt_entry_is_a_miss_and_is_retuned(tmp_path, monkeypatch, content):
    monkeypatch.setattr("cutile_perf.tune.keys.toolchain_versions", lambda: VERSIONS)
    tuner = _tuner(tmp_path, {c: 1.0 / c.occupancy for c in OCC})
    key_file = tmp_path / f"{persistent_key(tuner.persistent_parts('k'))}.json"
    key_file.write_text(content, encoding="latin-1")
    assert _tune(tuner).config == Config(occupancy=8)
    assert tuner.reports["k"].source == "search"
    assert json.loads(key_file.read_text())["config"] == {"occupancy": 8}  # overwritten with a good entry


def _writer(directory, worker, rounds):
    cache = TuneCache(directory)
    for i in range(rounds):
        cfg = OCC[(worker + i) % len(OCC)]
        cache.store("shared", parts(), cfg, [Trial(cfg, (float(i),))] * 50)  # big enough to tear if not atomic
        cache.store(f"own-{worker}-{i % 3}", parts(), cfg, [])


def _reader(directory, rounds, queue):
    cache = TuneCache(directory)
    seen = bad = 0
    for _ in range(rounds):
        path = cache.path("shared")
        if path.exists():
            try:
                json.loads(path.read_text())
                seen += 1
            except (ValueError, FileNotFoundError):
                bad += 1
    queue.put((seen, bad))


def test_concurrent_writers_never_leave_a_torn_file(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(tmp_path, w, 40)) for w in range(4)]
    reader = ctx.Process(target=_reader, args=(tmp_path, 400, queue))
    for p in writers + [reader]:
        p.start()
    for p in writers + [reader]:
        p.join(60)
        assert p.exitcode == 0
    seen, bad = queue.get(timeout=10)
    assert bad == 0
    cache = TuneCache(tmp_path)
    assert cache.load("shared", parts(), OCC) is not None
    assert len(list(tmp_path.glob("*.json"))) == 1 + 4 * 3
    assert not list(tmp_path.glob("*.tmp"))  # every temp file was moved into place
