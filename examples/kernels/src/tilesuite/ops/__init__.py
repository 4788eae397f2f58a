"""Operator backends. Only ``cutile`` is bundled; import the op modules directly."""
