"""Durable state: atomic files, the chained log and its history, git, the session settings and the compile cache."""
