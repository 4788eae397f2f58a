"""Subcommand implementations. Each returns an ``Outcome``; only ``cli`` prints it and exits."""
from cutile_perf.output import Outcome, say  # noqa: F401 - the commands' shared names
