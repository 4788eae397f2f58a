"""Checked timed calls (issue 39 items 1-3): what a perf test's timer computed, compared with the base kernel.

The target's perf tests hand a callable to a timing function (TileGym: ``benchmark_fn_cupti(fn)``,
``benchmark_fn(fn)``, ``benchmark_fn_cudagraph(fn)``; ``triton.testing.do_bench(fn)``). The plugin
wraps every such timer it identifies (``pytest_plugin``: a function of the target's test tree that
``kernel.target_timing.classify_timer`` calls a timer, and triton's two) with ``wrap_timer``. The
tests are not modified; the perf child runs them as always.

Capture (perf child, ``CUTILE_PERF_CHECK_DIR``):

* before the timer starts: the tensors the callable reads (``tensors_read_by``: its closure,
  ``functools.partial`` arguments, defaults, nested lambdas) are copied (the *snapshot*);
* during the timer: the callable is replaced by ``Sampled``, which counts the calls and, after each
  call returns, draws fresh random bits (``os.urandom``) to decide whether this call's result is the
  one kept (reservoir sampling: every timed call is equally likely to be the checked one, and the
  draw does not exist before the call ends, so no code can know during a call whether it is checked).
  Keeping a result is holding a Python reference: no copy, no device work. The previous call's
  result is held as well, so a call cannot be handed the very memory its predecessor wrote;
* after the timer has returned (the timed window is over): the kept result is copied to host
  memory, the inputs are compared with the snapshot (changed: the op works in place, and the kept
  result cannot be checked against the snapshot), then one more call is made *placed as the timed
  ones*: inputs put back to the snapshot, every cached block its outputs could get filled with NaN
  first (``stale_memory``: a call that skips its work returns NaN, not an earlier call's correct
  result), under the timer's own conditions (a ``torch.profiler`` session for a CUPTI timer, a CUDA
  graph replay for a graph timer), after all of the timer's calls. Both results, the snapshot and
  what was seen are saved with ``torch.save`` into the check folder, and the file's digest goes
  into the signed run report.

Replay (reference child, ``CUTILE_PERF_CHECK_REPLAY``): the same perf test from a checkout of the
*baseline* commit (the candidate's code is not in it). When the test reaches the same timer call
(by node id and its ordinal in the test), the callable the base test built reads the same tensors
(checked by path, shape and dtype); the captured inputs are copied into them, the callable is called
twice (a base kernel whose two results differ, e.g. dropout's random mask, cannot be checked), and
both captured results are compared with tolerances by dtype (``compare_results.TOLERANCES``). No timing runs there:
after the test's last timer call to check, the test is skipped. The verdict per call is a ``check``
line of the reference child's signed run report.

Floor (item 3): each check also reports the bytes the call must move (inputs read, outputs written)
and the reference child measures the device's copy bandwidth (``bandwidth``: a large copy for the
memory behind an L2 flush, a copy that fits in L2 for warm timing; on a CPU, host memory, simulated).

A timed backward pass (a callable that returns nothing and reads a tensor with a ``grad_fn``) is
checked by its gradients, on the call after the timer only (``checked_backward``).

Limits, stated where they show: another timed callable that returns no tensor (an op that writes
into an argument and returns None) is *unchecked*, and says so; in-place ops have only
the call after the timer checked; tensors reached only through objects (an ``nn.Module``'s
parameters, ``self.x``) are not found, so a callable with none found is unchecked; code in the same
process that reads this module's state (the kept reference, the counter) can still tell which call
was kept once it has returned, and can rewrite what is saved (the report's signature makes the
file's later replacement visible, not an in-process rewrite).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path

# checked_backward reads this module's helpers at call time only, so the two may import each other.
from cutile_perf.child import checked_backward, stale_memory, tensor_summary
from cutile_perf.child.compare_results import compare
from cutile_perf.child.copy_bandwidth import bandwidth

CAPTURE = "capture"
REPLAY = "replay"
_MAX_DEPTH = 3  # closures of closures of closures: deep enough for a test's lambda around an op call


class Setup:
    """What the plugin configured at load: the mode, the folder, and how to write a report line."""

    def __init__(self, mode: str, folder: Path, write: Callable[[dict], None] | None = None):
        self.mode, self.folder, self.write = mode, Path(folder), write
        self.nodeid = ""
        self.ordinal = 0
        self.measured = False
        self.captured_bytes = 0  # what this child saved so far (``capture_limit``)
        self.capture_limit = CAPTURE_LIMIT  # set from the disk by ``configure``
        # This test's timed callables by ordinal, and the last whose result carries a graph (its
        # forward): a backward call's check rebuilds the graph from it (``checked_backward``).
        self.callables: dict[int, Callable] = {}
        self.forward: tuple[int, Callable] | None = None
        self.index = _read_index(self.folder) if mode == REPLAY else {}


# What one perf child may save of its timed calls: a perf test of large shapes times dozens of calls
# of hundreds of MB each, and an unbounded capture filled a 64 GB disk during a TileGym baseline (H100).
# Past it, each further call is unchecked with that reason, on the row. A fixed 4 GB left the perf-only
# sizes unchecked, the very cases a change wrong only at big sizes needs checked (H200: silu_and_mul's
# fp32 hidden-8192 case alone saves 8.6 GB): so a third of the disk space free at the start, within
# these bounds (captures are deleted once judged, ``checkrun.discard_captures``).
CAPTURE_LIMIT = 4 << 30
CAPTURE_CEILING = 48 << 30


def capture_limit(free_bytes: int) -> int:
    """What one child may save, given the free bytes of its check folder's disk (pure)."""
    return max(CAPTURE_LIMIT, min(CAPTURE_CEILING, free_bytes // 3))


SETUP: Setup | None = None
_ACTIVE = threading.local()  # inside a wrapped timer: timers it calls are not wrapped twice


def configure(mode: str, folder: Path, write: Callable[[dict], None] | None = None) -> None:
    global SETUP
    SETUP = Setup(mode, folder, write)
    SETUP.folder.mkdir(parents=True, exist_ok=True)
    SETUP.capture_limit = capture_limit(shutil.disk_usage(SETUP.folder).free)


def begin_test(nodeid: str) -> None:
    if SETUP is not None:
        SETUP.nodeid, SETUP.ordinal = nodeid, 0
        SETUP.callables, SETUP.forward = {}, None


# --- what the timed callable reads ---------------------------------------------------------------


def tensors_read_by(fn, torch) -> list[tuple[str, object]]:
    """``[(path, tensor)]`` the callable can reach by value: closure cells, defaults, ``partial``
    arguments, bound ``self`` of a method when it is a tensor, and the same inside nested functions,
    lists, tuples and dicts (depth ``_MAX_DEPTH``). Paths name the route (``fn.cell[1][0]``), so the
    base checkout's callable is matched tensor for tensor. Each tensor once (by identity)."""
    found: list[tuple[str, object]] = []
    seen: set[int] = set()

    def walk(value, path: str, depth: int) -> None:
        if depth > _MAX_DEPTH or id(value) in seen:
            return
        if isinstance(value, torch.Tensor):
            seen.add(id(value))
            found.append((path, value))
            return
        seen.add(id(value))
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]", depth + 1)
        elif isinstance(value, dict):
            for key in sorted(value, key=repr):
                walk(value[key], f"{path}[{key!r}]", depth + 1)
        elif isinstance(value, functools.partial):
            walk(value.func, f"{path}.func", depth + 1)
            walk(value.args, f"{path}.args", depth + 1)
            walk(value.keywords, f"{path}.keywords", depth + 1)
        elif inspect.ismethod(value):
            walk(value.__func__, f"{path}.__func__", depth)
        elif inspect.isfunction(value):
            for i, cell in enumerate(value.__closure__ or ()):
                with contextlib.suppress(ValueError):  # an empty cell
                    walk(cell.cell_contents, f"{path}.cell[{i}]", depth + 1)
            walk(value.__defaults__ or (), f"{path}.defaults", depth + 1)
            walk(value.__kwdefaults__ or {}, f"{path}.kwdefaults", depth + 1)

    walk(fn, "fn", 0)
    return found


def tensors_in(value, torch) -> list:
    """The tensors of a call's result, in order (a tensor, or tuples/lists/dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_in(item, torch)]
    if isinstance(value, dict):
        return [t for key in sorted(value, key=repr) for t in tensors_in(value[key], torch)]
    return []


class Sampled:
    """The timed callable, counted, with one call's result kept by a draw made after each call."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0
        self.kept = None
        self.kept_index = 0
        self.previous = None

    def __call__(self, *args, **kwargs):
        result = self.fn(*args, **kwargs)
        self.calls += 1
        # Reservoir sampling of size one: call n replaces the kept result with probability 1/n.
        if int.from_bytes(os.urandom(4), "little") % self.calls == 0:
            self.kept, self.kept_index = result, self.calls
        self.previous = result
        return result

    def __getattr__(self, name):  # a timer that reads fn.__name__ and the like sees the real one
        return getattr(self.fn, name)


# --- the wrapper -------------------------------------------------------------------------------


def _timed_callable(args: tuple, kwargs: dict) -> tuple[object, str | int | None]:
    if args and callable(args[0]):
        return args[0], 0
    for name in ("fn", "func", "kernel_fn"):
        if callable(kwargs.get(name)):
            return kwargs[name], name
    return None, None


def _with_callable(args: tuple, kwargs: dict, where, fn) -> tuple[tuple, dict]:
    if where == 0:
        return (fn, *args[1:]), kwargs
    return args, {**kwargs, where: fn}


Conditions = Callable[[tuple, dict], tuple[str, str]]  # a timer call's arguments -> (method, L2)


def fixed(method: str, l2: str) -> Conditions:
    """The conditions of a timer whose method and L2 state do not depend on its arguments."""
    return lambda _args, _kwargs: (method, l2)


def wrap_timer(timer, conditions: Conditions, label: str):
    """``timer`` with its timed callable checked (module docstring); itself when nothing is configured.

    ``conditions`` says how each call times: ``fixed(...)``, or read from the call's arguments for a
    timer whose mode is one (``cutile_perf.bench.bench_record``); a mode it refuses (ValueError)
    is the timer's to report."""
    if getattr(timer, "__cutile_perf_checked__", False):
        return timer

    @functools.wraps(timer)
    def checked_timer(*args, **kwargs):
        fn, where = _timed_callable(args, kwargs)
        torch = sys.modules.get("torch")
        if SETUP is None or fn is None or torch is None or getattr(_ACTIVE, "on", False):
            return timer(*args, **kwargs)
        try:
            how, flushed = conditions(args, kwargs)
        except ValueError:
            return timer(*args, **kwargs)
        SETUP.ordinal += 1
        call = {"nodeid": SETUP.nodeid, "ordinal": SETUP.ordinal, "timer": label, "method": how, "l2": flushed}
        if SETUP.mode == REPLAY:
            return _replay(torch, timer, args, kwargs, fn, call)
        return _capture(torch, timer, args, kwargs, fn, where, call)

    checked_timer.__cutile_perf_checked__ = True
    return checked_timer


def _capture(torch, timer, args, kwargs, fn, where, call: dict):
    inputs = tensors_read_by(fn, torch)
    snapshot = [t.detach().clone() for _path, t in inputs]
    sampled = Sampled(fn)
    new_args, new_kwargs = _with_callable(args, kwargs, where, sampled)
    _ACTIVE.on = True
    try:
        result = timer(*new_args, **new_kwargs)
    finally:
        _ACTIVE.on = False
    # The timer has returned: from here on nothing is timed.
    try:
        line = _save_capture(torch, fn, sampled, inputs, snapshot, call)
    except Exception as exc:  # noqa: BLE001 - a check that could not be made says so, it never fails the test
        line = {**call, "status": "unchecked", "reason": f"capture failed: {type(exc).__name__}: {exc}"[:300]}
    finally:
        sampled.kept = sampled.previous = None
    if SETUP.write is not None:
        SETUP.write({"type": "checked", **line})
    return result


def _describe(tensors) -> list[list]:
    return [[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in tensors]


def _sync(torch) -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _save_capture(torch, fn, sampled: Sampled, inputs, snapshot, call: dict) -> dict:
    _sync(torch)
    kept = tensors_in(sampled.kept, torch)
    line = {**call, "calls": sampled.calls, "index": sampled.kept_index, "inputs": _describe(snapshot),
            "input_paths": [p for p, _t in inputs]}
    if not inputs:
        return {**line, "status": "unchecked", "reason": "the timed callable reads no tensor this check can find "
                                                         "(tensors held by objects, e.g. a module's parameters)"}
    if sampled.calls == 0:
        return {**line, "status": "unchecked", "reason": "the timer never called the callable"}
    if any(checked_backward.in_graph(t) for t in kept):
        SETUP.forward = (call["ordinal"], fn)
    if not kept and any(checked_backward.in_graph(t) for _p, t in inputs):
        return _save_backward(torch, fn, inputs, snapshot, line, call)
    if not kept:
        return {**line, "status": "unchecked", "reason": "the timed call returns no tensor (an op that writes into "
                                                         "an argument and returns nothing)"}
    changed = [p for (p, t), s in zip(inputs, snapshot) if not torch.equal(t, s)]
    input_ptrs = {t.untyped_storage().data_ptr() for _p, t in inputs}
    aliased = any(t.untyped_storage().data_ptr() in input_ptrs for t in kept)
    sampled_out = None if (changed or aliased) else [tensor_summary.keep_result(torch, t) for t in kept]
    after = _call_after(torch, fn, inputs, snapshot, kept, call["method"])
    line = {**line, "outputs": _describe(kept), "in_place": bool(changed or aliased),
            "bytes": sum(tensor_summary.nbytes(t) for t in (*snapshot, *kept))}
    if changed or aliased:
        line["sampled_note"] = ("the op works in place (" + (f"inputs changed: {', '.join(changed[:3])}" if changed
                                                             else "its result is an input") +
                                "): only the call after the timer, on restored inputs, is checked")
    payload = {"inputs": {p: tensor_summary.keep_input(torch, s) for (p, _t), s in zip(inputs, snapshot)},
               "sampled": sampled_out, "after": after, "call": line}
    return _store(torch, line, payload, saved_bytes(payload))


def saved_bytes(value) -> int:
    """The bytes of the tensors in a capture's payload (what counts against ``capture_limit``)."""
    if isinstance(value, dict):
        return sum(saved_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(saved_bytes(v) for v in value)
    return tensor_summary.nbytes(value) if hasattr(value, "element_size") else 0


def _save_backward(torch, fn, inputs, snapshot, line: dict, call: dict) -> dict:
    """A timed backward pass: its gradients, from one call after the timer (``checked_backward``)."""
    forward_ordinal, forward = SETUP.forward or (None, None)
    found = checked_backward.capture(torch, fn, inputs, snapshot, forward, call["method"])
    if isinstance(found, str):
        return {**line, "status": "unchecked", "reason": found}
    fields, grads = found
    # Kept values: tensors, or past tensor_summary.INLINE_BYTES a fingerprint or summary (dicts).
    kept = [*fields["inputs"].values(), *fields["leaves"].values(), *(g for g in grads if g is not None)]
    size = saved_bytes(kept)
    line = {**line, "backward": True, "forward_ordinal": forward_ordinal,
            "bytes": sum(tensor_summary.kept_nbytes(torch, v) for v in kept),
            "sampled_note": "a backward pass: the timed calls' gradients accumulate, so only the call after the "
                            "timer is checked"}
    return _store(torch, line, {**fields, "sampled": None, "after": grads, "call": line}, size)


def _store(torch, line: dict, payload: dict, size: int) -> dict:
    """Save one checked call within this run's capture limit; the signed report carries its digest."""
    if SETUP.captured_bytes + size > SETUP.capture_limit:
        return {**line, "status": "unchecked", "reason": f"this run's capture limit of {SETUP.capture_limit >> 30} GB "
                                                         f"was reached ({SETUP.captured_bytes >> 20} MB saved)"}
    SETUP.captured_bytes += size
    name = f"{hashlib.sha256(json.dumps([line['nodeid'], line['ordinal']]).encode()).hexdigest()[:16]}.pt"
    path = SETUP.folder / name
    torch.save(payload, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {**line, "status": "captured", "file": name, "sha256": digest}


@contextlib.contextmanager
def _conditions(torch, method: str):
    """The timer's own conditions around the call after it: a profiler session for a CUPTI timer."""
    if method == "cupti":
        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]):
            yield
    else:
        yield


def _call_after(torch, fn, inputs, snapshot, kept, method: str) -> list:
    for (_p, t), s in zip(inputs, snapshot):
        t.data.copy_(s)
    stale_memory.poison(torch, kept)
    if method == "cuda-graph" and torch.cuda.is_available() and torch.cuda.is_initialized():
        from cutile_perf import bench  # noqa: PLC0415

        replay = bench._graph_replay(torch, fn)  # its eager warm-up call may change in-place inputs
        for (_p, t), s in zip(inputs, snapshot):
            t.data.copy_(s)
        result = replay()
    else:
        with _conditions(torch, method):
            result = fn()
    _sync(torch)
    return [tensor_summary.keep_result(torch, t) for t in tensors_in(result, torch)]


# --- replay in the base checkout ---------------------------------------------------------------


def _read_index(folder: Path) -> dict:
    """{(nodeid, ordinal): capture line} from ``index.json`` the harness wrote next to the captures."""
    path = Path(folder) / "index.json"
    if not path.exists():
        return {}
    lines = json.loads(path.read_text(encoding="utf-8"))
    return {(line["nodeid"], int(line["ordinal"])): line for line in lines}


def _last_ordinal(nodeid: str) -> int:
    return max((o for (n, o), line in SETUP.index.items() if n == nodeid and line.get("status") == "captured"),
               default=0)


def _replay(torch, timer, args, kwargs, fn, call: dict):
    if not SETUP.measured and SETUP.write is not None:  # once per reference child: the floor's bandwidth
        SETUP.measured = True
        SETUP.write({"type": "check", "bandwidth": bandwidth(torch)})
    SETUP.callables[call["ordinal"]] = fn
    line = SETUP.index.get((call["nodeid"], call["ordinal"]))
    if line is not None and line.get("status") == "captured":
        try:
            verdict = check_against_base(torch, fn, SETUP.folder / line["file"], line)
        except Exception as exc:  # noqa: BLE001
            verdict = {"status": "unchecked", "reason": f"replay failed: {type(exc).__name__}: {exc}"[:300]}
        if SETUP.write is not None:
            SETUP.write({"type": "check", "nodeid": call["nodeid"], "ordinal": call["ordinal"], **verdict})
    if call["ordinal"] >= _last_ordinal(call["nodeid"]):
        import pytest  # noqa: PLC0415

        pytest.skip("cutile-perf: reference computed, nothing is timed in the reference child")
    return timer(*args, **kwargs)


def mismatched_inputs(found: list, captured: dict, what: str) -> str | None:
    """Why the base test's ``found`` (path, tensor) cannot take the captured values in, or None."""
    if [p for p, _t in found] != list(captured):
        return f"{what} reads other tensors than the candidate's (different closure)"
    for (path, t), c in zip(found, captured.values()):
        shape, dtype = tensor_summary.shape_and_dtype(c)
        if tuple(t.shape) != shape or str(t.dtype) != dtype:
            return f"{path}: {shape} {dtype} captured where the base test has {tuple(t.shape)} {t.dtype}"
    return None


def base_inputs(torch, found: list, captured: dict):
    """How to put the captured inputs into the base test's ``found`` tensors before each base call
    (a function), or why they cannot be: a fingerprinted input (``tensor_summary``) must be what the
    base test built itself, and is put back from a copy of it."""
    originals = {}
    for (path, t), c in zip(found, captured.values()):
        if not tensor_summary.is_kept_whole(c):
            if tensor_summary.fingerprint(torch, t) != c["fingerprint"]:
                return (f"{path} ({tensor_summary.nbytes(t) >> 20} MB, too large to save whole) is not the tensor "
                        "the base test builds: only a test whose inputs are seeded can be checked at this size")
            originals[path] = t.detach().clone()

    def put_back() -> None:
        for (path, t), c in zip(found, captured.values()):
            t.data.copy_(originals[path] if path in originals else c.to(t.device))
    return put_back


def check_against_base(torch, fn, capture: Path, line: dict) -> dict:
    """The base kernel on the captured inputs, compared with the candidate's sampled and after-timer results."""
    payload = torch.load(capture, map_location="cpu", weights_only=True)
    if payload.get("kind") == "backward":
        forward = SETUP.callables.get(line.get("forward_ordinal"))
        return checked_backward.check(torch, fn, forward, payload, {
            "bytes": line.get("bytes"), "calls": line.get("calls"), "index": line.get("index"), "in_place": False,
            "l2": line.get("l2"), "method": line.get("method")})
    inputs = tensors_read_by(fn, torch)
    captured = payload["inputs"]
    why = mismatched_inputs(inputs, captured, "the base test's timed callable")
    if why:
        return {"status": "unchecked", "reason": why}
    put_back = base_inputs(torch, inputs, captured)
    if isinstance(put_back, str):
        return {"status": "unchecked", "reason": put_back}
    results = []
    for _ in range(2):  # twice: a base kernel that does not repeat itself cannot judge another
        put_back()
        results.append([t.detach().clone() for t in tensors_in(fn(), torch)])  # compared on the device
        _sync(torch)
    reference, again = results
    bytes_moved = sum(tensor_summary.nbytes(t) for _p, t in inputs) + sum(tensor_summary.nbytes(r) for r in reference)
    common = {"bytes": bytes_moved, "calls": line.get("calls"), "index": line.get("index"),
              "in_place": line.get("in_place", False), "l2": line.get("l2"), "method": line.get("method")}
    if compare(torch, reference, again) is not None:
        return {**common, "status": "unchecked", "reason": "the base kernel's two results on the same inputs differ "
                                                           "(random output, e.g. dropout): nothing to compare with"}
    found = []
    if payload.get("sampled") is not None:
        why = compare(torch, reference, payload["sampled"])
        if why:
            found.append(f"timed call {line.get('index')} of {line.get('calls')}: {why}")
    why = compare(torch, reference, payload["after"])
    if why:
        found.append(f"call {int(line.get('calls') or 0) + 1}, after the timer, under its conditions: {why}")
    if found:
        return {**common, "status": "mismatch", "reason": "; ".join(found)}
    checked = "the sampled timed call and the call after the timer" if payload.get("sampled") is not None else \
        "the call after the timer only (in-place op)"
    return {**common, "status": "ok", "reason": checked}
