"""The profiler path: CUPTI samples (the ``cupti`` modes), the device-time witness, and paying the
profiler's one-off set-up before anything is timed.

The device-time witness: after the samples, ``bench`` profiles ``WITNESS_CALLS`` more calls with
``torch.profiler`` (CUPTI) and keeps the median of one call's device time, as ``device_ms`` in the
record. In the event modes that is the span of the call's kernels (first kernel start to last
kernel end; ``graph-warm``: of one replay, over its calls), each call queued behind the flush as the
timed calls are: events bracket everything the call queues, so an honest median is never much below
that span. In the CUPTI modes it is the samples' own quantity (sum of kernel durations, flushed the
same way) taken again after them: a span would include the gaps the samples leave out and flag an
honest op of several kernels. A record that claims much less (``judge.rules.witness_shortfall``)
had its timer or its arithmetic tampered with in a way the plugin's identity check cannot see (one
``Event`` object patched, a patch applied and undone around the samples), and the harness calls the
stage ``tampered``. Both numbers come from the same process: a candidate that rewrites CUPTI's
buffers or the driver in native code defeats both (``docs/design.md``, "Limits").

Torch is passed in (or imported lazily): importing this module needs neither torch nor a GPU.
"""
from __future__ import annotations

import os

from cutile_perf.bench.checked_calls import OutputCheck, clone, compare_checked, fresh_inputs
from cutile_perf.judge import stats

WITNESS_CALLS = 3  # calls profiled for the device-time witness (median of their device times)

# Every CUDA process on Linux opens the driver's control node, and the box binds it in
# (``child.boxinit.DEV_PREFIXES``). A host without it has no GPU to profile, so paying the
# profiler's one-off set-up there buys nothing but seconds of a core beside the run it was meant to
# help (measured on the CPU suite: docs/design.md, "What a spare does while it waits").
NVIDIA_CONTROL_NODE = "/dev/nvidiactl"


def cuda_host() -> bool:
    """Whether a process on this host could use an NVIDIA GPU at all (``NVIDIA_CONTROL_NODE`` exists)."""
    return os.path.exists(NVIDIA_CONTROL_NODE)


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


def profiled_samples(torch, call, count: int, flush_buf, check: OutputCheck | None = None) -> list[float]:
    """``count`` CUPTI samples (the cupti modes): per call the sum of its kernels' durations (ms).

    Sum, not span, because that is what the target's CUPTI timer reports (TileGym sums the
    profile's ``self_device_time_total``): gaps between one call's kernels are not counted, and
    kernels on two streams that overlap count twice, as there. Checked calls as in ``bench._timed``."""
    samples, checked = [], []
    for index in range(count):
        expected = fresh_inputs(torch, check, index, count)
        kernels, result = _profile_call(torch, call, flush_buf, flush_outside=True)
        sample = _kernel_sum_ms(kernels)
        if sample is None:
            raise RuntimeError("CUPTI saw no device work in a profiled call: fn launched no kernel, or CUPTI "
                               "(libcupti) is not available to torch.profiler here; time with an events mode")
        samples.append(sample)
        if expected is not None:
            checked.append((index, clone(torch, result), expected))
    compare_checked(check, checked, count)
    return samples


def warm_up_profiler() -> bool:
    """Run one tiny ``torch.profiler`` session with CUDA activity, so that the process's first one
    (CUPTI and the profiler's own set-up: seconds, measured in ``docs/results/2026-12-02-h200-speed.md``,
    section 1) is not paid by a record's witness or a CUPTI-timed sample. A pre-started perf
    child calls it while it waits for the correctness run (``pytest_plugin.Gate``); it times
    nothing and leaves nothing behind. Returns whether a session ran."""
    try:
        import torch  # noqa: PLC0415 - lazy: importing cutile_perf must not need torch

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
    the session ran; one that cannot run changes nothing (the first witness pays it). Not run on a
    host without a GPU (``cuda_host``)."""
    if not cuda_host():
        return False
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
    """The device-time witness (this module's docstring): the median device time of ``calls`` profiled
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
