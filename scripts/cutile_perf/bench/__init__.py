"""THE timing method: every perf test, benchmark and decision in cutile-perf goes through ``bench``.

``bench(fn)`` returns raw per-call GPU times in milliseconds; ``bench_record(fn)`` summarizes them
into TileGym's record (mean, std, rel_std %, median, min, max, nrep, peak_mem_mb) with
``stats.summarize``. Statistics live in ``stats.py``; this module only produces samples.

Why it is done this way:

* **CUDA events, not the wall clock.** A kernel launch returns before the kernel runs, so a host
  timer measures launch and Python overhead, or needs a synchronize per call that adds tens of
  microseconds. An event pair recorded on the stream around ``fn`` measures what the GPU spent
  between the two points. All events are read after ONE synchronize at the end, so the host never
  stalls the queue between samples.
* **Cold L2 by default.** The H200's L2 is 60 MB; a 2 MB input would stay resident between
  repetitions and make a memory-bound kernel look faster than it is in a model, where other work
  evicts it. Before each sample a buffer of twice the L2 size is zeroed (outside the event pair),
  which evicts the kernel's data. ``mode="warm"`` skips the flush, to study the cache-resident case.
* **Graph mode removes host gaps.** If ``fn`` launches several kernels with Python work between
  them (allocation, ``.contiguous()``), the GPU idles in between and events include those gaps.
  ``mode="graph"`` captures ``fn`` once in a CUDA graph and times ``graph.replay()``, so only device
  work is measured; L2 is still flushed before each sample.
* **The target's own conditions, exactly.** A change wins only what the judge's timing can see
  (``kernel.target_timing`` reads how the target's perf tests time), so every (method, L2) pair it
  can report has a mode here: ``cold``/``warm`` (events around each call, flushed or not),
  ``graph`` (events around a replay of one call, flushed) and ``graph-warm`` (TileGym's cudagraph
  path: one graph of many back-to-back calls, events around each replay, no flush; a sample is the
  replay's time over its calls, so the replay's own launch cost is spread over ``GRAPH_SAMPLE_MS``),
  ``cupti`` and ``cupti-warm`` (TileGym's default CUPTI path: per sample, flush or not, synchronize,
  then one ``torch.profiler`` session around one call; the sample is the sum of that call's kernel
  durations, launch gaps and host work not counted). Each profiled sample costs a profiler session
  on the host, so those modes take at most ``CUPTI_MAX_SAMPLES`` samples.
* **Time budgets, converted to counts from an estimate.** A few calls estimate the run time; the
  warm-up and measurement budgets (ms) are turned into counts, clamped to ``[min_reps, max_reps]``.
  A 3 us kernel gets thousands of samples, a 30 ms kernel gets ``min_reps``. Warm-up runs compile
  the kernel (cuTile JITs on first launch) and bring clocks up before anything is recorded.
* **Work the events cannot see is caught, not timed as free.** An event pair on the current stream
  only brackets work queued on that stream: a kernel launched on a side stream that the current
  stream never waits for runs after (or beside) the end event, so its time vanishes from the sample
  (a red-team attack, docs/design.md, "Attacks and outcomes"). Synchronizing the whole device before the end event
  would expose it, but puts a host round trip (and the next launch's host overhead) inside every
  sample. Instead, after the samples, ``bench`` times one batch of calls twice: by an event pair on
  the current stream, and by the host clock from a device-wide ``synchronize`` to the next one. The
  start event is recorded on an idle device and the end event after the last launch, so the event
  interval already includes launch gaps; all the host interval adds is the sync round trips, plus
  any device work left running after the end event. When that excess exceeds
  ``HIDDEN_WORK_FRACTION`` of the batch plus ``HIDDEN_WORK_SLACK_MS`` in every one of
  ``ESCAPE_TRIALS`` batches, ``bench`` raises ``HiddenDeviceWork`` (the perf test fails, and the
  iteration crashes instead of recording a time nobody measured). ``check_escape=False`` turns it off.
  Per mode: the event and graph modes run it (a graph's batch entry is one replay; capturing
  already refuses a side stream that never joins back). The CUPTI modes skip it: their samples
  cannot miss such work, because CUPTI records kernels on every stream and each profiled window
  ends with a device-wide synchronize. No mode counts host work as device time: a candidate that
  computes on the CPU and copies the result shows only the copy under CUPTI (as under the target's
  CUPTI timer), and under events only as long as the GPU waits for it.
* **A device-time witness beside the samples** (``bench.profiler``): after the samples, a few more
  calls are profiled with CUPTI; a record that claims much less than their device time had its
  timer or arithmetic tampered with.
* **Checked calls** (``bench.checked_calls``): with ``check=OutputCheck(...)``, the first and the
  last timed sample run on fresh inputs and their results are compared with a reference
  (``WrongWhenTimed`` when they differ).
* **Raw samples, median downstream.** Timings have a long right tail (preemption, clock changes),
  so decisions use the median (and ``stats.ratio_ci`` for a ratio of two); the mean is reported
  only because TileGym's record has it. ``min_reps`` defaults to 10 samples.

Torch is imported lazily: the pure planning functions run on machines without torch or a GPU.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from cutile_perf import knobs
from cutile_perf.bench.checked_calls import OutputCheck, WrongWhenTimed, clone, compare_checked, fresh_inputs
from cutile_perf.bench.profiler import (WITNESS_CALLS, cuda_host, device_time_ms, prepare_profiler_without_context,
                                        profiled_samples, warm_up_profiler)
from cutile_perf.errors import EnvMissing
from cutile_perf.judge import stats

__all__ = ["CUPTI_MAX_SAMPLES", "MODES", "WITNESS_CALLS", "HiddenDeviceWork", "Measurement", "OutputCheck",
           "WrongWhenTimed", "bench", "bench_record", "check_mode", "cuda_host", "device_time_ms", "flush_bytes", "graph_unroll",
           "hidden_work", "measure", "plan_counts", "prepare_profiler_without_context", "sample_bounds",
           "warm_up_profiler"]

MODES = knobs.BENCH_MODES  # cold, warm, graph, graph-warm, cupti, cupti-warm
# Per mode: what a sample times ("events" around each call, "cuda-graph" replays timed by events,
# "cupti" kernel durations from torch.profiler) and whether L2 is flushed before each sample. The
# timer names are ``kernel.target_timing``'s, which checked timed calls read for a target's timers.
MODE_TIMERS = {
    "cold": ("events", True), "warm": ("events", False),
    "graph": ("cuda-graph", True), "graph-warm": ("cuda-graph", False),
    "cupti": ("cupti", True), "cupti-warm": ("cupti", False),
}
ESTIMATE_CALLS = 5  # calls timed to estimate the run time before the budgets are turned into counts
DEFAULT_L2_BYTES = 64 * 2**20  # used only if torch cannot report the L2 size (older torch)
FLUSH_FACTOR = 2  # flush buffer = FLUSH_FACTOR x L2: one pass of L2 size may leave lines behind


ESCAPE_BATCH_MS = 20.0  # device time one escape-check batch aims at
ESCAPE_MAX_CALLS = 1000
ESCAPE_TRIALS = 2  # flag only when every batch shows the excess: one OS hiccup is not an attack
HIDDEN_WORK_FRACTION = 0.25  # excess host time, as a fraction of the batch's event time...
HIDDEN_WORK_SLACK_MS = 1.0  # ...plus this, allowed for the sync round trips and scheduling


# graph-warm: one replay runs back-to-back calls for about this much device time, as TileGym's
# cudagraph timer unrolls rep/10 ms of calls (50 ms / 10 by default) into one graph, so the replay's
# own launch and its event pair (microseconds) are spread over thousands of microseconds.
GRAPH_SAMPLE_MS = 5.0
GRAPH_MAX_UNROLL = 1000  # calls captured in one graph at most: capture runs fn's Python each time
# cupti modes: every sample is one profiler session, started, stopped and parsed on the host, a cost
# the time budgets (device time) do not see; a 3 us kernel would otherwise get 2000 sessions.
CUPTI_MAX_SAMPLES = 100


class HiddenDeviceWork(RuntimeError):
    """``fn`` left device work running that the timing events did not cover (e.g. a side stream)."""


def hidden_work(host_ms: float, event_ms: float, *, fraction: float = HIDDEN_WORK_FRACTION,
                slack_ms: float = HIDDEN_WORK_SLACK_MS) -> float | None:
    """The device time (ms) of one batch that the events missed, or None when the gap is within bounds.

    ``host_ms``: host clock from a device-wide synchronize before the batch to one after it;
    ``event_ms``: an event pair on the current stream around the same batch. Pure, for tests.
    """
    excess = host_ms - event_ms
    return excess if excess > fraction * event_ms + slack_ms else None


def check_mode(mode: str | None) -> str:
    """The timing mode to use: ``mode`` if given, else ``CUTILE_PERF_BENCH_MODE`` (default cold)."""
    chosen = knobs.bench_mode() if mode is None else mode
    if chosen not in MODES:
        raise ValueError(f"bench mode {chosen!r}: expected one of {', '.join(MODES)}")
    return chosen


def graph_unroll(estimate_ms: float) -> int:
    """graph-warm: how many back-to-back calls one replay runs, for a call of ``estimate_ms``
    (enough for ``GRAPH_SAMPLE_MS``, at least 1, at most ``GRAPH_MAX_UNROLL``)."""
    return max(1, min(GRAPH_MAX_UNROLL, math.ceil(GRAPH_SAMPLE_MS / max(estimate_ms, 1e-3))))


def sample_bounds(mode: str, min_reps: int, max_reps: int) -> tuple[int, int]:
    """``(min_reps, max_reps)`` for ``mode``: the CUPTI modes cap the samples at
    ``CUPTI_MAX_SAMPLES`` (never below ``min_reps``), the others take them as given."""
    if MODE_TIMERS[mode][0] == "cupti":
        return min_reps, min(max_reps, max(min_reps, CUPTI_MAX_SAMPLES))
    return min_reps, max_reps


def plan_counts(
    estimate_ms: float, *, warmup_ms: float, rep_ms: float, min_reps: int, max_reps: int
) -> tuple[int, int]:
    """(warm-up calls, timed samples) that fill the two budgets for a call of ``estimate_ms``.

    At least one warm-up call; samples are clamped to ``[min_reps, max_reps]``. A zero or negative
    estimate (a kernel below event resolution) is treated as 1 us so the counts stay finite.
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got min_reps={min_reps}, max_reps={max_reps}")
    if warmup_ms < 0 or rep_ms < 0:
        raise ValueError("warmup_ms and rep_ms must be >= 0")
    per_call = max(estimate_ms, 1e-3)
    n_warmup = max(1, math.ceil(warmup_ms / per_call))
    n_rep = min(max_reps, max(min_reps, math.ceil(rep_ms / per_call)))
    return n_warmup, n_rep


def flush_bytes(l2_bytes: int | None) -> int:
    """Size of the buffer zeroed before each cold sample: twice the L2, or twice 64 MiB if unknown."""
    base = l2_bytes if l2_bytes and l2_bytes > 0 else DEFAULT_L2_BYTES
    return FLUSH_FACTOR * base


def _torch():
    import torch  # lazy: importing cutile_perf must not need torch

    if not torch.cuda.is_available():

        raise EnvMissing("bench needs a CUDA GPU visible to torch", "run on the GPU machine")
    return torch


def _graph_replay(torch, fn: Callable[[], object], calls: int = 1) -> Callable[[], object]:
    """Capture ``calls`` back-to-back calls of ``fn`` in one CUDA graph; the returned call replays it
    and returns the last captured call's result (the graph writes into the same output tensors on
    every replay). ``fn`` runs once first, so nothing (cuTile's JIT, allocator growth) happens for
    the first time during capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            result = fn()

    def replay():
        graph.replay()
        return result

    return replay


def _timed(torch, call, count: int, flush_buf, check: OutputCheck | None = None) -> list[float]:
    """``count`` event-timed calls; the flush (if any) is enqueued before the start event. With
    ``check``, the first and last calls run on fresh inputs and their results are compared after the
    one synchronize (the refresh and the reference run before the flush, outside the events)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    checked = []
    for index, (start, end) in enumerate(zip(starts, ends)):
        expected = fresh_inputs(torch, check, index, count)
        if flush_buf is not None:
            flush_buf.zero_()
        start.record()
        result = call()
        end.record()
        if expected is not None:
            checked.append((index, clone(torch, result), expected))
    torch.cuda.synchronize()
    compare_checked(check, checked, count)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


@dataclass(frozen=True)
class Measurement:
    samples: list[float]  # ms per sample, in the order they ran
    device_ms: float | None  # the device-time witness; None when not taken or not possible
    checked_calls: int  # timed calls whose results were compared with the reference


def bench(fn: Callable[[], object], **kwargs) -> list[float]:
    """Raw GPU times of ``fn()`` in milliseconds, one per sample, in the order they ran
    (``measure(fn, **kwargs).samples``; see ``measure`` for the arguments)."""
    return measure(fn, **kwargs).samples


def measure(
    fn: Callable[[], object],
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    mode: str | None = None,
    min_reps: int = 10,
    max_reps: int = 2000,
    check_escape: bool = True,
    check: OutputCheck | None = None,
    witness: bool = False,
) -> Measurement:
    """Time ``fn()``: the samples, and optionally the device-time witness and checked calls.

    ``mode``: one of ``MODES``, each described in the module docstring ("The target's own
    conditions"); ``None`` reads ``CUTILE_PERF_BENCH_MODE``. ``check``: compare the first and last
    timed samples with a reference on fresh inputs; ``witness``: profile a few more calls for
    ``device_ms``. Raises ``errors.EnvMissing`` without a CUDA GPU, ``HiddenDeviceWork`` when
    ``check_escape`` finds device work that outlives the timing events (not checked in the CUPTI
    modes, whose samples count it), and ``WrongWhenTimed`` when a checked call's result is wrong.
    """
    chosen = check_mode(mode)
    timer, flushed = MODE_TIMERS[chosen]
    torch = _torch()
    call = _graph_replay(torch, fn) if timer == "cuda-graph" else fn
    flush_buf = None
    if flushed:
        l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", None)
        flush_buf = torch.empty(flush_bytes(l2), dtype=torch.int8, device="cuda")
    call()  # first call compiles (cuTile JIT) and must not reach the estimate
    torch.cuda.synchronize()
    estimate = stats.median(_timed(torch, call, ESTIMATE_CALLS, flush_buf))
    per_sample = 1  # calls of fn one sample times (graph-warm: the calls one replay runs)
    if timer == "cuda-graph" and not flushed:
        per_sample = graph_unroll(estimate)
        if per_sample > 1:
            call = _graph_replay(torch, fn, per_sample)
    low, high = sample_bounds(chosen, min_reps, max_reps)
    n_warmup, n_rep = plan_counts(estimate * per_sample, warmup_ms=warmup_ms, rep_ms=rep_ms,
                                  min_reps=low, max_reps=high)
    for _ in range(n_warmup):
        call()
    if check is not None:
        n_rep = max(n_rep, 2)  # the first and the last sample are checked: two different calls
    samples = (profiled_samples(torch, call, n_rep, flush_buf, check) if timer == "cupti"
               else [ms / per_sample for ms in _timed(torch, call, n_rep, flush_buf, check)])
    device_ms = device_time_ms(torch, call, flush_buf, cupti=timer == "cupti") if witness else None
    if device_ms is not None:
        device_ms /= per_sample
    if check_escape and timer != "cupti":
        _check_escape(torch, call, stats.median(samples) * per_sample)
    return Measurement(samples, device_ms, 2 if check is not None else 0)


def _batch_times(torch, call, count: int) -> tuple[float, float]:
    """(host ms, event ms) of ``count`` back-to-back calls, the host interval between device-wide syncs."""
    import time

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    for _ in range(count):
        call()
    end.record()
    torch.cuda.synchronize()  # device-wide: waits for every stream, not only the current one
    host_ms = (time.perf_counter() - t0) * 1e3
    return host_ms, start.elapsed_time(end)


def _check_escape(torch, call, median_ms: float) -> None:
    count = max(1, min(ESCAPE_MAX_CALLS, math.ceil(ESCAPE_BATCH_MS / max(median_ms, 1e-3))))
    found = []
    for _ in range(ESCAPE_TRIALS):
        host_ms, event_ms = _batch_times(torch, call, count)
        excess = hidden_work(host_ms, event_ms)
        if excess is None:
            return
        found.append((host_ms, event_ms))
    host_ms, event_ms = found[-1]
    raise HiddenDeviceWork(
        f"device work outside the timing events: {count} calls took {host_ms:.3f} ms between device-wide "
        f"synchronizes but {event_ms:.3f} ms between events on the current stream (work on another stream "
        "that the current stream never waits for?); the samples would not include it")


def bench_record(fn: Callable[[], object], *, witness: bool = True, **bench_kwargs) -> dict[str, float]:
    """TileGym's benchmark record for ``fn``: ``stats.summarize`` of the samples plus ``peak_mem_mb``,
    the witness's ``device_ms`` when it could be taken, and ``checked_calls`` when ``check`` was given.

    ``peak_mem_mb`` is torch's peak allocated memory during one call of ``fn`` (inputs included,
    the flush buffer excluded), as TileGym reports it. The witness is on by default here: a record
    is what the harness judges, and the harness cross-checks the two (``judge.rules.witness_shortfall``).
    """
    torch = _torch()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak_mb = torch.cuda.max_memory_allocated() / 2**20
    result = measure(fn, witness=witness, **bench_kwargs)
    record = stats.summarize(result.samples, peak_mem_mb=round(peak_mb, 1))
    if result.device_ms is not None:
        record["device_ms"] = round(result.device_ms, 6)
    if result.checked_calls:
        record["checked_calls"] = result.checked_calls
    return record
