"""Run a Tunable's configs on its shapes: the shared engine of ``probe``, ``ab`` and ``prune``."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cutile_perf.errors import EnvMissing, IterationCrashed
from cutile_perf.tune.analysis import ABRow, ab_row
from cutile_perf.tune.autotuner import Autotuner, TuneReport
from cutile_perf.tune.config import Config, Trial, best_trial
from cutile_perf.tune.splitbuf import split_buffer
from cutile_perf.tune.timing import BenchTimer, Candidate, CuTileTimer
from cutile_perf.tune.tunable import Tunable, shape_label


def require_gpu() -> None:
    try:
        import torch
    except ImportError:
        raise EnvMissing("this command times kernels and needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise EnvMissing("this command times kernels and needs an NVIDIA GPU; none is visible",
                         hint="run it on the GPU machine")


def make_tuner(tunable: Tunable, configs: Sequence[Config], *, fakes: dict[str, Any] | None = None,
               timer: Any = None) -> Autotuner:
    """An exhaustive, non-persistent tuner over ``configs``; ``fakes`` injects timer/launcher/device/precompile for tests.

    The default timer times every config (no probe cut): these commands report each config's time
    on each shape, not only which one wins.
    """
    fakes = dict(fakes or {})
    if not fakes:
        require_gpu()
    space = list(configs) if tunable.fixed in configs else [tunable.fixed, *configs]
    timer = fakes.pop("timer", timer if timer is not None else CuTileTimer(cut=None))
    return Autotuner(tunable.kernel, space, fixed=tunable.fixed, name=tunable.name, persistent=False,
                     timer=timer, precompile=fakes.pop("precompile", "auto"), **fakes)


def stream_for(fakes: dict[str, Any] | None) -> Any:
    if fakes:
        return 0
    import torch

    return torch.cuda.current_stream()


def run_shapes(tuner: Autotuner, tunable: Tunable, shapes: Sequence[dict[str, int]], *, stream: Any) -> dict[str, list[Trial]]:
    """Every config of the tuner on every shape (exhaustive), as shape label -> trials."""
    results: dict[str, list[Trial]] = {}
    for shape in shapes:
        problem = tunable.problem(shape)
        args_fn = split_buffer(problem.args_fn, problem.inplace) if problem.inplace else problem.args_fn
        results[shape_label(shape)] = tuner.search(stream, problem.grid_fn, args_fn, TuneReport("search"),
                                                   real_args_fn=problem.args_fn)
    return results


AB_ROUNDS = 2  # the winner and the fixed config, interleaved, this many times each


def ab_confirm(fakes: dict[str, Any], rep_ms: float) -> Any:
    """The timer that compares the winner with the fixed config (``fakes["confirm"]`` in tests; taken out)."""
    return fakes.pop("confirm", None) or BenchTimer(warmup_ms=25.0, rep_ms=rep_ms)


def ab_shape(tuner: Autotuner, tunable: Tunable, shape: dict[str, int], confirm: Any, *, stream: Any) -> ABRow:
    """One shape of ``ab``: an exhaustive search picks the winner, then the winner and the fixed
    config are timed again, interleaved, by ``confirm`` alone (one method for both)."""
    label = shape_label(shape)
    problem = tunable.problem(shape)
    args_fn = split_buffer(problem.args_fn, problem.inplace) if problem.inplace else problem.args_fn
    best = best_trial(tuner.search(stream, problem.grid_fn, args_fn, TuneReport("search")))
    if best is None:
        raise IterationCrashed(f"every config of {tunable.name} failed on {label}")
    pair = [tunable.fixed, best.config]
    samples: dict = {c: [] for c in pair}
    for _ in range(AB_ROUNDS):
        cands = [Candidate(c, tuner.kernel_for(c), tuple(problem.grid_fn(c)), tuple(args_fn(c)), stream,
                           tuner.launcher) for c in pair]
        for trial in confirm(cands):
            if not trial.ok:
                raise IterationCrashed(f"{trial.config.label()} failed on {label}: {trial.error} {trial.detail[-200:]}")
            samples[trial.config].extend(trial.times)
    return ab_row(label, best.config, tunable.fixed, samples[best.config], samples[tunable.fixed])
