"""Scoring answers: rewards as ASearcher computes them, and chat endpoints for judges."""
