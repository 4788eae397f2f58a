"""The timing method: count planning, flush sizing and mode selection on CPU; real timing on GPU."""
from __future__ import annotations

import pytest

from cutile_perf import bench


@pytest.mark.parametrize(
    "estimate_ms, expected",
    [
        (0.01, (2500, 2000)),  # 10 us kernel: budget asks 10000 samples, capped at max_reps
        (1.0, (25, 100)),  # budgets divided by the estimate
        (50.0, (1, 10)),  # slow kernel: one warm-up, min_reps samples
        (0.0, (25000, 2000)),  # below event resolution: treated as 1 us, still finite
    ],
)
def test_plan_counts_turns_time_budgets_into_counts(estimate_ms, expected):
    assert bench.plan_counts(estimate_ms, warmup_ms=25.0, rep_ms=100.0, min_reps=10, max_reps=2000) == expected


def test_plan_counts_never_returns_zero_warmup_even_with_zero_budget():
    # The first timed call must never be a cold one: at least one warm-up always runs.
    assert bench.plan_counts(5.0, warmup_ms=0.0, rep_ms=0.0, min_reps=3, max_reps=10) == (1, 3)


@pytest.mark.parametrize("kwargs", [dict(min_reps=0, max_reps=5), dict(min_reps=10, max_reps=5)])
def test_plan_counts_rejects_impossible_bounds(kwargs):
    with pytest.raises(ValueError, match="min_reps"):
        bench.plan_counts(1.0, warmup_ms=1.0, rep_ms=1.0, **kwargs)


def test_flush_buffer_is_twice_l2_and_has_a_fallback():
    assert bench.flush_bytes(60 * 2**20) == 120 * 2**20  # H200 reports 60 MB of L2
    assert bench.flush_bytes(None) == 2 * bench.DEFAULT_L2_BYTES
    assert bench.flush_bytes(0) == 2 * bench.DEFAULT_L2_BYTES


def test_mode_comes_from_the_env_knob_unless_given(monkeypatch):
    monkeypatch.setenv("CUTILE_PERF_BENCH_MODE", "warm")
    assert bench.check_mode(None) == "warm"
    assert bench.check_mode("graph") == "graph"
    monkeypatch.delenv("CUTILE_PERF_BENCH_MODE")
    assert bench.check_mode(None) == "cold"


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="cold, warm, graph"):
        bench.check_mode("hot")


def test_importing_bench_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, cutile_perf.bench; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", bench.MODES)
def test_bench_times_a_copy_in_every_mode(mode):
    """On the GPU: raw positive samples in ms, count within bounds, a 256 MB copy near memory bandwidth."""
    import torch

    src = torch.empty(128 * 2**20, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    samples = bench.bench(lambda: dst.copy_(src), mode=mode, min_reps=10, max_reps=200)
    assert 10 <= len(samples) <= 200
    assert all(s > 0 for s in samples)
    moved_bytes = 2 * src.numel() * src.element_size()
    tb_per_s = moved_bytes / (sorted(samples)[len(samples) // 2] * 1e-3) / 1e12
    assert 0.5 < tb_per_s < 10.0, f"{tb_per_s:.2f} TB/s is not a plausible copy rate"


@pytest.mark.gpu
def test_bench_record_has_tilegym_fields():
    import torch

    x = torch.randn(4096, 4096, device="cuda")
    record = bench.bench_record(lambda: x * 2.0, max_reps=50)
    assert set(record) == {"mean", "std", "rel_std", "median", "min", "max", "nrep", "peak_mem_mb", "device_ms"}
    assert record["min"] <= record["median"] <= record["max"]
    assert record["peak_mem_mb"] >= x.numel() * 4 / 2**20


@pytest.mark.gpu
@pytest.mark.parametrize("mode", bench.MODES)
def test_the_device_time_witness_agrees_with_honest_events(mode):
    """An honest record passes its own cross-check: the events' median is not below the profiled span."""
    import torch

    from cutile_perf.judge import rules

    src = torch.empty(64 * 2**20, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    record = bench.bench_record(lambda: dst.copy_(src), mode=mode, max_reps=100)
    assert record["device_ms"] > 0
    assert rules.witness_shortfall(record["median"], record["device_ms"]) is None, record
    assert record["device_ms"] <= 1.25 * record["median"], record


@pytest.mark.gpu
def test_halved_event_readings_are_contradicted_by_the_witness(monkeypatch):
    """Whatever halves the events' readings (here the class method, in the attack one object's method
    or a patch put back before the plugin looks), the CUPTI witness still sees the device's time."""
    import torch

    from cutile_perf.judge import rules

    src = torch.empty(64 * 2**20, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    real = torch.cuda.Event.elapsed_time
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, other: real(self, other) / 2)
    record = bench.bench_record(lambda: dst.copy_(src), mode="cold", max_reps=50, check_escape=False)
    assert rules.witness_shortfall(record["median"], record["device_ms"]) is not None, record


def test_device_span_skips_the_lead_kernels_and_spans_the_calls_own():
    import types

    def event(start, end, device="DeviceType.CUDA"):
        return types.SimpleNamespace(device_type=device, time_range=types.SimpleNamespace(start=start, end=end))

    # flush 0-40 us, a second lead kernel 40-140 us, the call's two kernels 141-200 and 205-260 us; a CPU
    # event ignored.
    prof = types.SimpleNamespace(events=lambda: [event(141, 200), event(0, 40), event(205, 260), event(40, 140),
                                                 event(0, 500, device="DeviceType.CPU")])
    assert bench._device_span_ms(prof, 2) == pytest.approx(0.119)
    assert bench._device_span_ms(prof, 4) is None  # nothing of the call left


@pytest.mark.gpu
@pytest.mark.parametrize("mode", bench.MODES)
def test_checked_calls_pass_an_honest_kernel_and_fail_one_that_shrinks_when_timed(mode):
    import torch

    x = torch.randn(4096, 1024, device="cuda")
    out = torch.empty_like(x)
    calls = {"n": 0}

    def honest():
        return torch.mul(x, 2.0, out=out)

    def shrinking():  # full work for the first 20 calls (the tests), 60 % of the rows after that
        calls["n"] += 1
        rows = x.shape[0] if calls["n"] <= 20 else int(0.6 * x.shape[0])
        torch.mul(x[:rows], 2.0, out=out[:rows])
        return out

    check = bench.OutputCheck((x,), lambda: x * 2.0, lambda a, e: torch.testing.assert_close(a, e))
    record = bench.bench_record(honest, mode=mode, max_reps=50, check=check)
    assert record["checked_calls"] == 2
    with pytest.raises(bench.WrongWhenTimed, match="fresh inputs"):
        bench.bench_record(shrinking, mode=mode if mode != "graph" else "cold", max_reps=50, check=check)


# --- checked calls on CPU: the same logic with a stand-in for torch.cuda's events ------------------


class _FakeEvent:
    def __init__(self, enable_timing=False):
        pass

    def record(self):
        pass

    def elapsed_time(self, other):
        return 1.0


def _cpu_torch():
    import types

    torch = pytest.importorskip("torch")
    fake = types.SimpleNamespace(Tensor=torch.Tensor, randperm=torch.randperm,
                                 cuda=types.SimpleNamespace(Event=_FakeEvent, synchronize=lambda: None))
    return torch, fake


def test_timed_checks_the_first_and_last_call_on_fresh_inputs():
    torch, fake = _cpu_torch()
    x = torch.arange(4000, dtype=torch.float32).reshape(400, 10)
    before = x.clone()
    out = torch.empty_like(x)
    check = bench.OutputCheck((x,), lambda: x * 2.0, lambda a, e: torch.testing.assert_close(a, e))
    samples = bench._timed(fake, lambda: torch.mul(x, 2.0, out=out), 7, None, check)
    assert samples == [1.0] * 7
    assert not torch.equal(x, before) and torch.equal(x.flatten().sort().values, before.flatten().sort().values)


@pytest.mark.parametrize("attack", ["shrink after the tests", "cache by pointer"])
def test_timed_catches_a_kernel_that_behaves_differently_when_timed(attack):
    torch, fake = _cpu_torch()
    x = torch.randn(400, 10)
    out = torch.empty_like(x)
    cache = {}

    def hostile():
        if attack == "cache by pointer":  # computed once per input address, then returned as is
            if x.data_ptr() not in cache:
                cache[x.data_ptr()] = x * 2.0
            return cache[x.data_ptr()]
        torch.mul(x[:240], 2.0, out=out[:240])  # 60 % of the rows; the rest keep an old result
        return out

    torch.mul(x, 2.0, out=out)  # what the correctness test saw
    hostile()
    check = bench.OutputCheck((x,), lambda: x * 2.0, lambda a, e: torch.testing.assert_close(a, e))
    with pytest.raises(bench.WrongWhenTimed, match="timed call 1 of 5"):
        bench._timed(fake, hostile, 5, None, check)


@pytest.mark.parametrize(
    "host_ms, event_ms, hidden",
    [
        (20.2, 20.0, None),  # sync round trips only
        (26.0, 20.0, None),  # within 25 % + 1 ms: a scheduling hiccup is not an attack
        (30.0, 20.0, 10.0),  # 10 ms of device work the events never saw
        (900.0, 20.0, 880.0),  # the whole kernel on a side stream, only the launches on the timed one
        (1.5, 0.1, 1.4),  # tiny batch: the 1 ms slack dominates
    ],
)
def test_hidden_work_flags_device_time_the_events_missed(host_ms, event_ms, hidden):
    assert bench.hidden_work(host_ms, event_ms) == (pytest.approx(hidden) if hidden is not None else None)


@pytest.mark.gpu
def test_side_stream_work_is_caught_and_plain_work_is_not():
    """A red-team attack: the copy runs on a side stream the current stream never waits for, so
    the event pair times nothing. bench must raise instead of returning near-zero samples."""
    import torch

    src = torch.empty(128 * 2**20, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    side = torch.cuda.Stream()

    def hidden_copy():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dst.copy_(src)

    with pytest.raises(bench.HiddenDeviceWork, match="outside the timing events"):
        bench.bench(hidden_copy, mode="warm", max_reps=50)
    assert len(bench.bench(lambda: dst.copy_(src), mode="warm", max_reps=50)) >= 10
