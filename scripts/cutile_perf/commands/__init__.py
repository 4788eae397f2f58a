"""Subcommand implementations. Each returns an ``Outcome``; only ``cli`` prints it and exits."""
