"""Checked timed calls (``child/checked.py``) in the child: the target's timing functions, Triton's and
our own ``cutile_perf.bench.bench_record`` are replaced by their checked wrappers the moment their
module's own code has run, before the timer identity captures them (so the wrappers are what is
guarded) and before any test calls them.
"""
from __future__ import annotations

import inspect

from cutile_perf.child import checked


def timer_kind(func) -> tuple[str, str]:
    """(method, L2) of a Python function by what its body calls (``target_timing.classify_timer``),
    ("unknown", "unknown") when it is no timer or its source cannot be read."""
    import ast  # noqa: PLC0415
    import textwrap  # noqa: PLC0415

    from cutile_perf.kernel.target_timing import classify_timer  # noqa: PLC0415

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return "unknown", "unknown"
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return "unknown", "unknown"
    return classify_timer(node)


def wrap_target_timers(module) -> list[str]:
    """Replace each timing function ``module`` defines (the target's test tree) by its checked wrapper;
    returns their names. Run the moment the module's code has run, before the tests call them."""
    wrapped = []
    for name, value in list(vars(module).items()):
        if not inspect.isfunction(value) or value.__module__ != module.__name__:
            continue
        method, l2 = timer_kind(value)
        if method != "unknown":
            setattr(module, name, checked.wrap_timer(value, checked.fixed(method, l2), f"{module.__name__}.{name}"))
            wrapped.append(name)
    return wrapped


def wrap_triton_timers(module) -> None:
    for name, method, l2 in (("do_bench", "events", "flushed"), ("do_bench_cudagraph", "cuda-graph", "not flushed")):
        timer = getattr(module, name, None)
        if callable(timer):
            setattr(module, name, checked.wrap_timer(timer, checked.fixed(method, l2), f"triton.testing.{name}"))


def wrap_bench(module) -> None:
    """``cutile_perf.bench.bench_record`` checked like a target's timer: the bundled kernels' perf tests
    and ``scaffold-perf``'s reach it through a helper of their test tree that no timer classification
    names, and without this their timed calls would get neither the base kernel's replay nor a
    floor. ``bench_record`` (what makes a record), not ``measure`` or ``bench``: the tuner times its
    configs with those, calls that are no record and would shift the replay's ordinals. Its mode is
    an argument, so its conditions are read per call."""
    def conditions(args: tuple, kwargs: dict) -> tuple[str, str]:
        timer, flushed = module.MODE_TIMERS[module.check_mode(kwargs.get("mode"))]
        return timer, "flushed" if flushed else "not flushed"

    module.bench_record = checked.wrap_timer(module.bench_record, conditions, "cutile_perf.bench.bench_record")
