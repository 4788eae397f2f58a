"""The decision rules, their statistics and the crash classes: pure functions over evidence."""
