"""Watching a run: the metrics processor (TensorBoard) and the run ledger proven from topics."""
