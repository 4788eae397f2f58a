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
* **A device-time witness beside the samples.** After the samples, ``bench`` profiles
  ``WITNESS_CALLS`` more calls with ``torch.profiler`` (CUPTI) and keeps the median of one call's
  device time, as ``device_ms`` in the record. In the event modes that is the span of the call's
  kernels (first kernel start to last kernel end; ``graph-warm``: of one replay, over its calls),
  each call queued behind the flush as the timed calls are: events bracket everything the call
  queues, so an honest median is never much below that span. In the CUPTI modes it is the samples'
  own quantity (sum of kernel durations, flushed the same way) taken again after them: a span would
  include the gaps the samples leave out and flag an honest op of several kernels. A record that
  claims much less (``judge.rules.witness_shortfall``) had its timer or its arithmetic tampered with
  in a way the plugin's identity check cannot see (one ``Event`` object patched, a patch applied
  and undone around the samples), and the harness calls the stage ``tampered``. Both numbers come
  from the same process: a candidate that rewrites CUPTI's buffers or the driver in native code
  defeats both (``docs/design.md``, "Limits").
* **Checked calls.** With ``check=OutputCheck(inputs, reference, compare)``, the first and the last
  timed sample run on fresh input values (each input tensor's values permuted in place, so shapes,
  addresses and value distributions stay, the numbers do not) and their results are compared with
  ``reference()`` after the samples. A kernel that does less work only when timed (counted calls,
  a context it detects) fails the perf test instead of being timed as faster (``WrongWhenTimed``).
* **Raw samples, median downstream.** Timings have a long right tail (preemption, clock changes),
  so decisions use the median and its confidence interval (``stats.median_ci``/``ratio_ci``); the
  mean is reported only because TileGym's record has it. With >= 10 samples the median's 95 %
  interval is bounded by order statistics, which is why ``min_reps`` defaults to 10.

Torch is imported lazily: the pure planning functions run on machines without torch or a GPU.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cutile_perf import knobs
from cutile_perf.judge import stats
from cutile_perf.errors import EnvMissing

MODES = knobs.BENCH_MODES  # cold, warm, graph, graph-warm, cupti, cupti-warm
# Per mode: what a sample times ("events" around each call, "graph" replays timed by events,
# "cupti" kernel durations from torch.profiler) and whether L2 is flushed before each sample.
MODE_TIMERS = {
    "cold": ("events", True), "warm": ("events", False),
    "graph": ("graph", True), "graph-warm": ("graph", False),
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


WITNESS_CALLS = 3  # calls profiled for the device-time witness (median of their device times)

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


class WrongWhenTimed(AssertionError):
    """A timed call's result differs from the reference: the kernel behaves differently when timed.

    An ``AssertionError``, so the perf test fails as a test (pytest shows the comparison)."""


@dataclass(frozen=True)
class OutputCheck:
    """What ``bench`` needs to check the timed calls' results (module docstring, "Checked calls").

    ``inputs``: the tensors ``fn`` reads; their values are permuted in place before a checked call.
    ``reference()``: the expected result for the inputs' current values (computed before the call).
    ``compare(actual, expected)``: raises ``AssertionError`` when they differ (the test's tolerance).
    """

    inputs: Sequence[object]
    reference: Callable[[], object]
    compare: Callable[[object, object], None]

    def refresh(self, torch) -> None:
        """New values for every input tensor: a random permutation of its own values."""
        for tensor in self.inputs:
            if isinstance(tensor, torch.Tensor) and tensor.numel() > 1:
                order = torch.randperm(tensor.numel(), device=tensor.device)
                tensor.copy_(tensor.reshape(-1)[order].reshape(tensor.shape))


def _clone(torch, value):
    """A copy of a call's result that the next call cannot overwrite (graph outputs are reused)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(torch, v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(torch, v) for k, v in value.items()}
    return value


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


def _fresh_inputs(torch, check: OutputCheck | None, index: int, count: int):
    """Checked calls (module docstring): before the first and the last of ``count`` calls, new input
    values and the reference's result for them; None for every other call."""
    if check is None or index not in (0, count - 1):
        return None
    check.refresh(torch)
    return check.reference()


def _compare_checked(check: OutputCheck | None, checked: list, count: int) -> None:
    """Compare the checked calls' results (after the samples' one synchronize)."""
    for index, actual, expected in checked:
        try:
            check.compare(actual, expected)
        except AssertionError as exc:
            raise WrongWhenTimed(f"timed call {index + 1} of {count} (fresh inputs) differs from the reference: "
                                 f"{str(exc).strip()[:300]}") from None


def _timed(torch, call, count: int, flush_buf, check: OutputCheck | None = None) -> list[float]:
    """``count`` event-timed calls; the flush (if any) is enqueued before the start event. With
    ``check``, the first and last calls run on fresh inputs and their results are compared after the
    one synchronize (the refresh and the reference run before the flush, outside the events)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    checked = []
    for index, (start, end) in enumerate(zip(starts, ends)):
        expected = _fresh_inputs(torch, check, index, count)
        if flush_buf is not None:
            flush_buf.zero_()
        start.record()
        result = call()
        end.record()
        if expected is not None:
            checked.append((index, _clone(torch, result), expected))
    torch.cuda.synchronize()
    _compare_checked(check, checked, count)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _call_kernels(prof, lead_kernels: int) -> list[tuple[float, float]]:
    """(start, end) in us of one profiled call's device work (kernels, copies, memsets): the profile's
    device events after the ``lead_kernels`` queued ahead of the call, less any that began before
    those ended."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if str(getattr(e, "device_type", "")).endswith("CUDA") and getattr(e, "time_range", None))
    lead, own = spans[:lead_kernels], spans[lead_kernels:]
    cut = max((end for _s, end in lead), default=float("-inf"))
    return [(start, end) for start, end in own if start >= cut]


def _span_ms(kernels: list[tuple[float, float]]) -> float | None:
    """First kernel's start to last kernel's end (ms); None without a kernel."""
    if not kernels:
        return None
    return (max(end for _s, end in kernels) - min(start for start, _e in kernels)) / 1e3


def _kernel_sum_ms(kernels: list[tuple[float, float]]) -> float | None:
    """Sum of the kernels' own durations (ms); None without a kernel."""
    if not kernels:
        return None
    return sum(end - start for start, end in kernels) / 1e3


def _device_span_ms(prof, lead_kernels: int) -> float | None:
    """One profiled call's device time: from the first kernel after the ``lead_kernels`` queued ahead
    of it to the last kernel's end (ms); None when the profile holds no kernel of the call."""
    return _span_ms(_call_kernels(prof, lead_kernels))


def _profile_call(torch, call, flush_buf, *, flush_outside: bool) -> tuple[list[tuple[float, float]], object]:
    """(the call's device work as (start, end) us, its result) from one ``torch.profiler`` session
    that ends with a device-wide synchronize, so work on any stream is in it.

    ``flush_outside``: flush and synchronize before the session starts, as TileGym's CUPTI timer
    does (the CUPTI modes: the profile holds the call alone); otherwise the flush is queued inside
    the session right ahead of the call, as the event-timed calls are queued behind it (the
    witness of the event modes), and left out of the call's kernels."""
    profiler = torch.profiler
    torch.cuda.synchronize()
    if flush_buf is not None and flush_outside:
        flush_buf.zero_()
        torch.cuda.synchronize()
    with profiler.profile(activities=[profiler.ProfilerActivity.CUDA]) as prof:
        if flush_buf is not None and not flush_outside:
            flush_buf.zero_()
        result = call()
        torch.cuda.synchronize()
    lead_kernels = 1 if flush_buf is not None and not flush_outside else 0
    return _call_kernels(prof, lead_kernels), result


def _profiled(torch, call, count: int, flush_buf, check: OutputCheck | None = None) -> list[float]:
    """``count`` CUPTI samples (the cupti modes): per call the sum of its kernels' durations (ms).

    Sum, not span, because that is what the target's CUPTI timer reports (TileGym sums the
    profile's ``self_device_time_total``): gaps between one call's kernels are not counted, and
    kernels on two streams that overlap count twice, as there. Checked calls as in ``_timed``."""
    samples, checked = [], []
    for index in range(count):
        expected = _fresh_inputs(torch, check, index, count)
        kernels, result = _profile_call(torch, call, flush_buf, flush_outside=True)
        sample = _kernel_sum_ms(kernels)
        if sample is None:
            raise RuntimeError("CUPTI saw no device work in a profiled call: fn launched no kernel, or CUPTI "
                               "(libcupti) is not available to torch.profiler here; time with an events mode")
        samples.append(sample)
        if expected is not None:
            checked.append((index, _clone(torch, result), expected))
    _compare_checked(check, checked, count)
    return samples


def warm_up_profiler() -> bool:
    """Run one tiny ``torch.profiler`` session with CUDA activity, so that the process's first one
    (CUPTI and the profiler's own set-up: seconds, measured in ``docs/results/2026-12-02-h200-speed.md``,
    section 1) is not paid by a record's witness or a CUPTI-timed sample. A pre-started perf
    child calls it while it waits for the correctness run (``pytest_plugin.Gate``); it times
    nothing and leaves nothing behind. Returns whether a session ran."""
    try:
        torch = _torch()
        if not torch.cuda.is_available():
            return False
        probe = torch.zeros(1, device="cuda")
        profiler = torch.profiler
        with profiler.profile(activities=[profiler.ProfilerActivity.CUDA]) as prof:
            probe.add_(1)
            torch.cuda.synchronize()
        prof.events()  # the results' first conversion is part of the one-off cost
        return True
    except Exception:  # noqa: BLE001 - a warm-up that cannot run changes nothing: the record pays it instead
        return False


def prepare_profiler_without_context() -> bool:
    """Pay most of the profiler's one-off set-up with a CPU-only ``torch.profiler`` session, which
    makes no CUDA context: a perf child started ahead of its turn calls it while it waits
    (``child.warmstart``), where no CUDA context may exist yet. The session makes no context
    (``torch.cuda.is_initialized`` stays false, ``nvidia-smi`` does not list the process), and the
    process's first CUDA profile afterwards is nearly free (``benchmarks/profiler_warmup.py``; the
    figures are in ``docs/results/2026-12-02-h200-speed.md``, section 9). It does initialize the CUDA
    driver (``cuInit``, no context; same document, section 12), which is why ``child.warmstart``
    checks its preloads before it. Returns whether
    the session ran; one that cannot run changes nothing (the first witness pays it)."""
    try:
        import torch  # noqa: PLC0415 - lazy, as everywhere in this module
        from torch import profiler  # noqa: PLC0415

        with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as prof:
            torch.ones(4).add_(1)
        prof.events()  # the results' first conversion is part of the one-off cost
        return True
    except Exception:  # noqa: BLE001 - see the docstring
        return False


def device_time_ms(torch, call, flush_buf, calls: int = WITNESS_CALLS, *, cupti: bool = False) -> float | None:
    """The device-time witness (module docstring): the median device time of ``calls`` profiled
    calls, or None when the profiler cannot run here (no CUPTI, a profiler already active).

    Event modes (``cupti=False``): per call the smaller of its kernels' span and their summed
    durations, the call queued behind the L2 flush when the samples had one, as the timed calls
    are. The span alone counts idle time between a call's kernels that the timed calls do not
    always pay: cuBLAS GEMMs' events read well under their span, while their summed kernel time
    stayed close to the events (``benchmarks/witness_check.py``; the ratios are in
    ``docs/results/2026-12-02-h200-trust.md``, "The witness in every bench mode"). The sum alone
    would count kernels on two streams that overlap twice. The smaller of the two is the device
    time no honest event pair can claim much less than.
    CUPTI modes (``cupti=True``): the sum of each call's kernel durations, flushed as the samples
    are, so an honest record's median and its witness measure the same thing."""
    try:
        times = []
        for _ in range(calls):
            kernels, _result = _profile_call(torch, call, flush_buf, flush_outside=cupti)
            if cupti:
                times.append(_kernel_sum_ms(kernels))
            else:
                span, busy = _span_ms(kernels), _kernel_sum_ms(kernels)
                times.append(None if span is None or busy is None else min(span, busy))
    except (RuntimeError, AssertionError, ImportError, AttributeError):
        return None
    positive = [t for t in times if t is not None and t > 0]
    return stats.median(positive) if positive else None


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

    ``mode``: one of ``MODES`` (module docstring, "The target's own conditions"): ``"cold"`` (events,
    L2 flushed before each sample), ``"warm"`` (events, no flush), ``"graph"`` (a CUDA graph of one
    call replayed, flushed), ``"graph-warm"`` (a graph of back-to-back calls, no flush; a sample is
    per call), ``"cupti"``/``"cupti-warm"`` (one profiled call per sample, its kernels' summed
    durations, flushed or not); ``None`` reads ``CUTILE_PERF_BENCH_MODE``. ``check``: compare the
    first and last timed samples with a reference on fresh inputs; ``witness``: profile a few more
    calls for ``device_ms``. Raises ``errors.EnvMissing`` without a CUDA GPU, ``HiddenDeviceWork``
    when ``check_escape`` finds device work that outlives the timing events (not checked in the
    CUPTI modes, whose samples count it), and ``WrongWhenTimed`` when a checked call's result is
    wrong (see the module docstring).
    """
    chosen = check_mode(mode)
    timer, flushed = MODE_TIMERS[chosen]
    torch = _torch()
    call = _graph_replay(torch, fn) if timer == "graph" else fn
    flush_buf = None
    if flushed:
        l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", None)
        flush_buf = torch.empty(flush_bytes(l2), dtype=torch.int8, device="cuda")
    call()  # first call compiles (cuTile JIT) and must not reach the estimate
    torch.cuda.synchronize()
    estimate = stats.median(_timed(torch, call, ESTIMATE_CALLS, flush_buf))
    per_sample = 1  # calls of fn one sample times (graph-warm: the calls one replay runs)
    if timer == "graph" and not flushed:
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
    if timer == "cupti":
        samples = _profiled(torch, call, n_rep, flush_buf, check)
    else:
        samples = [ms / per_sample for ms in _timed(torch, call, n_rep, flush_buf, check)]
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
