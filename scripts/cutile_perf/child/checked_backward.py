"""Checked timed calls of a backward pass (issue 39 item 1): the gradients, where the test times them.

A perf test that times the backward (TileGym's ``benchmark``: ``lambda: out.backward(dy,
retain_graph=True)``) hands the timer a callable that returns nothing: what it computes lands in
the ``.grad`` of the leaves of ``out``'s graph. That graph was built by an earlier timed callable of
the same test, the forward (``lambda: op(x)``), whose result carries a ``grad_fn``; ``checked``
remembers each test's last such callable and its ordinal.

Capture (perf child): after the timer, the leaves the forward reads (tensors that require grad) get
``.grad = None``, the timed callable is called once more under the timer's conditions (as
``checked._call_after`` does for a forward), and the leaves' gradients are that call's result. The
timed calls themselves cannot be sampled: their gradients accumulate into the same ``.grad``. The
leaves' values and the callable's other tensors (``dy``) are saved; the leaves' earlier gradients
are put back.

Replay (reference child, base checkout): the base test's forward (by the captured ordinal) is
called on the captured leaf values, its new output put where the base's backward callable holds its
graph (a closure cell, a list or dict item), the captured ``dy`` copied in, and the base's own
callable called: the leaves' gradients are the reference, twice (a base whose two differ cannot
judge), compared with the candidate's by dtype tolerance. What cannot be matched or rebound is
unchecked, with the reason; it never fails the test.
"""
from __future__ import annotations

import ast
import contextlib
import re

from cutile_perf.child import checked, compare_results, tensor_summary

_STEP = re.compile(r"\.cell\[(\d+)\]|\[(\d+)\]|\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]|\.(func|args|keywords|__func__|defaults|kwdefaults)")


def in_graph(t) -> bool:
    """A tensor some backward call can flow through: an autograd graph's output."""
    return getattr(t, "grad_fn", None) is not None


def leaves_of(forward, torch) -> list[tuple[str, object]]:
    """``[(path, tensor)]`` the forward callable reads that gradients land in."""
    return [(p, t) for p, t in checked.tensors_read_by(forward, torch) if t.is_leaf and t.requires_grad]


def capture(torch, fn, inputs, snapshot, forward, method: str) -> tuple[dict, list] | str:
    """(payload fields, the gradients as host tensors or None) of one backward call placed as the
    timed ones, or why it cannot be checked."""
    if forward is None:
        return "a backward pass whose forward call this check did not see"
    leaves = leaves_of(forward, torch)
    if not leaves:
        return "a backward pass whose forward reads no tensor that requires grad"
    earlier = [t.grad for _p, t in leaves]
    try:
        for _p, t in leaves:
            t.grad = None
        with checked._conditions(torch, method):
            fn()
        checked._sync(torch)
        grads = [None if t.grad is None else tensor_summary.keep_result(torch, t.grad) for _p, t in leaves]
    finally:
        for (_p, t), g in zip(leaves, earlier):
            t.grad = g
    others = {p: tensor_summary.keep_input(torch, s) for (p, t), s in zip(inputs, snapshot) if not in_graph(t)}
    kept_leaves = {p: tensor_summary.keep_input(torch, t) for p, t in leaves}
    fields = {"kind": "backward", "inputs": others, "leaves": kept_leaves}
    return fields, grads


def check(torch, fn, forward, payload: dict, common: dict) -> dict:
    """The base's gradients on the captured leaves and ``dy`` against the candidate's (module docstring)."""
    if forward is None:
        return {**common, "status": "unchecked", "reason": "the base test's forward call was not found"}
    inputs = checked.tensors_read_by(fn, torch)
    graph = [(p, t) for p, t in inputs if in_graph(t)]
    others = [(p, t) for p, t in inputs if not in_graph(t)]
    leaves = leaves_of(forward, torch)
    why = (checked.mismatched_inputs(others, payload["inputs"], "the base test's backward callable") or
           checked.mismatched_inputs(leaves, payload["leaves"], "the base test's forward callable"))
    if why:
        return {**common, "status": "unchecked", "reason": why}
    put_back = [checked.base_inputs(torch, leaves, payload["leaves"]),
                checked.base_inputs(torch, others, payload["inputs"])]
    refused = next((p for p in put_back if isinstance(p, str)), None)
    if refused:
        return {**common, "status": "unchecked", "reason": refused}
    results = []
    for _ in range(2):  # twice: a base that does not repeat itself cannot judge another
        for put in put_back:
            put()
        for _p, t in leaves:
            t.grad = None
        outputs = [t for t in checked.tensors_in(forward(), torch) if in_graph(t)]
        if len(outputs) != len(graph) or not all(_set_at(fn, p, out) for (p, _t), out in zip(graph, outputs)):
            return {**common, "status": "unchecked",
                    "reason": "the base test's backward callable holds its graph where it cannot be rebound"}
        fn()
        checked._sync(torch)
        # Kept on the device: the comparison runs there (``compare_results``).
        results.append([None if t.grad is None else t.grad.detach().clone() for _p, t in leaves])
    if compare(torch, results[0], results[1]) is not None:
        return {**common, "status": "unchecked", "reason": "the base kernel's two gradients on the same inputs differ"}
    why = compare(torch, results[0], payload["after"])
    if why:
        return {**common, "status": "mismatch",
                "reason": f"call {int(common.get('calls') or 0) + 1}, after the timer, under its conditions: {why}"}
    return {**common, "status": "ok", "reason": "the backward call after the timer (its gradients)"}


def compare(torch, expected: list, actual: list) -> str | None:
    """``compare_results.compare`` where a leaf may have no gradient at all."""
    if len(expected) != len(actual):
        return f"{len(actual)} gradient(s) where the base kernel gives {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        if (e is None) != (a is None):
            return f"gradient {i}: " + ("none" if a is None else "one") + " where the base kernel gives " + \
                ("one" if a is None else "none")
    present = [(e, a) for e, a in zip(expected, actual) if e is not None]
    return compare_results.compare(torch, [e for e, _a in present], [a for _e, a in present])


def _set_at(fn, path: str, value) -> bool:
    """Put ``value`` where ``path`` (``checked.tensors_read_by``'s route) leads inside ``fn``; False when
    the last step is not a place that can be set (a tuple item, a default)."""
    steps = _STEP.findall(path.removeprefix("fn"))
    if not steps:
        return False
    holder = fn
    with contextlib.suppress(Exception):
        for step in steps[:-1]:
            holder = _get(holder, step)
        cell, index, key, _attr = steps[-1]
        if cell:
            holder.__closure__[int(cell)].cell_contents = value
        elif index and isinstance(holder, list):
            holder[int(index)] = value
        elif key and isinstance(holder, dict):
            holder[ast.literal_eval(key)] = value
        else:
            return False
        return True
    return False


def _get(holder, step):
    cell, index, key, attr = step
    if cell:
        return holder.__closure__[int(cell)].cell_contents
    if index:
        return holder[int(index)]
    if key:
        return holder[ast.literal_eval(key)]
    return {"defaults": lambda h: h.__defaults__ or (), "kwdefaults": lambda h: h.__kwdefaults__ or {}}.get(
        attr, lambda h: getattr(h, attr))(holder)
