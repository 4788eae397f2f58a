"""Durable state: atomic files, the chained log, git, the session settings and the compile cache."""
