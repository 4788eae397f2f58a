"""``cutile-perf install-skill``: copy SKILL.md and references/ where coding agents look for skills."""
from cutile_perf.skill.install import install_skill  # noqa: F401 - the command is the library call
