"""The experiment loop: one iteration as a transaction, batches, budgets, and the views of the log."""
