"""The experiment loop: the session's history, one iteration as a transaction, and its views."""
