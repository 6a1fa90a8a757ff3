"""Behaviour cloning: the step and the job that replays trajectories from a topic."""
