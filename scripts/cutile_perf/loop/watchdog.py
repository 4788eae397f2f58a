"""The harness's own deadline: no command holds the session's lock forever.

The iteration budget (``measure.Deadline``) bounds the pytest children. The harness's own steps
between them (git, copying checkouts, reading what children left) are bounded by what they read
(``store.safe_read``), but one blocking call we did not foresee (a FIFO opened without
``O_NONBLOCK``, a stuck filesystem) would still hold the lock past any budget. ``overrun_guard``
arms a real-time alarm for the children's budget plus a generous grace; when it fires, the
blocked call is interrupted (PEP 475 retries a system call only when the handler returns) and
``HarnessOverran`` unwinds through the iteration's own settling, so the row says the harness
overran, the candidate is reverted and the lock is released.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from cutile_perf.errors import IterationCrashed

# The harness's own work in one iteration is seconds (its share is in each row's `timings`); the
# grace is far beyond it so that a slow disk never ends an honest iteration.
GRACE_S = 600.0
GRACE_FRACTION = 0.5  # and half the children's budget on top, for long sessions


class HarnessOverran(IterationCrashed):
    """The command ran past the children's budget plus the harness's grace."""


def deadline_s(children_budget_s: float) -> float:
    """The wall time a command may take: its children's budget, then the harness's grace."""
    return children_budget_s * (1 + GRACE_FRACTION) + GRACE_S


@contextmanager
def overrun_guard(children_budget_s: float, command: str) -> Iterator[None]:
    """Raise ``HarnessOverran`` in the main thread if the block runs past ``deadline_s``.

    Outside the main thread (a library caller on a thread) signals cannot be used: no guard."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    limit = deadline_s(children_budget_s)

    def _overran(signum, frame):
        raise HarnessOverran(f"`{command}` ran {limit:.0f} s, past its children's budget of "
                             f"{children_budget_s:.0f} s and the harness's grace",
                             "a step of the harness was blocked (a FIFO, a stuck disk?); the change is saved in "
                             "its patch: fix the cause, then run `cutile-perf resume`")

    previous = signal.signal(signal.SIGALRM, _overran)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
