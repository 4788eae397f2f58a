"""``cutile-perf init``: branch, locate kernel and test, classify, check the environment, write the session."""
from cutile_perf.loop.init import init  # noqa: F401 - the command is the library call
