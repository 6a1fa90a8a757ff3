"""Watching a run: the metrics processor (TensorBoard), the run ledger proven from topics, and
one run's records told apart on the shared topics."""
