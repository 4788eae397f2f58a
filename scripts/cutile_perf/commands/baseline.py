"""``cutile-perf baseline``: iteration 0, no code change: correctness, then perf ``repeats`` times."""
from cutile_perf.loop.baseline import baseline  # noqa: F401 - the command is the library call
