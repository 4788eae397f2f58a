"""Checked calls: the timed calls' results compared with a reference the candidate cannot reach.

With ``check=OutputCheck(inputs, reference, compare)``, the first and the last timed sample run on
fresh input values (each input tensor's values permuted in place, so shapes, addresses and value
distributions stay, the numbers do not) and their results are compared with ``reference()`` after
the samples. A kernel that does less work only when timed (counted calls, a context it detects)
fails the perf test instead of being timed as faster (``WrongWhenTimed``). Both timing paths (the
events in ``bench``, the profiler in ``bench.profiler``) check their calls through these functions.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


class WrongWhenTimed(AssertionError):
    """A timed call's result differs from the reference: the kernel behaves differently when timed.

    An ``AssertionError``, so the perf test fails as a test (pytest shows the comparison)."""


@dataclass(frozen=True)
class OutputCheck:
    """What ``bench`` needs to check the timed calls' results (this module's docstring).

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


def clone(torch, value):
    """A copy of a call's result that the next call cannot overwrite (graph outputs are reused)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(clone(torch, v) for v in value)
    if isinstance(value, dict):
        return {k: clone(torch, v) for k, v in value.items()}
    return value


def fresh_inputs(torch, check: OutputCheck | None, index: int, count: int):
    """Before the first and the last of ``count`` calls, new input values and the reference's result
    for them; None for every other call."""
    if check is None or index not in (0, count - 1):
        return None
    check.refresh(torch)
    return check.reference()


def compare_checked(check: OutputCheck | None, checked: list, count: int) -> None:
    """Compare the checked calls' results (after the samples' one synchronize)."""
    for index, actual, expected in checked:
        try:
            check.compare(actual, expected)
        except AssertionError as exc:
            raise WrongWhenTimed(f"timed call {index + 1} of {count} (fresh inputs) differs from the reference: "
                                 f"{str(exc).strip()[:300]}") from None
