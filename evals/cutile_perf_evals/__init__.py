"""Evals of the cutile-perf skill graded by measurement: build a task repo, run an agent, grade what it left.

Modules: ``tasks`` (evals.json), ``build`` (task repositories), ``shim`` (the logging ``cutile-perf``
put on the agent's PATH), ``agent`` (launching an agent under a time limit), ``measure`` (correctness
and interleaved timing in clean checkouts), ``grade`` (the verdict), ``report`` (results table),
``cli`` (``python evals/run.py``).
"""
from pathlib import Path

EVALS_DIR = Path(__file__).resolve().parent.parent
CHECKOUT = EVALS_DIR.parent
