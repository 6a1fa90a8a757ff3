"""Evaluation: benchmarks, profiles, scores, and the evaluation processor (faust)."""
