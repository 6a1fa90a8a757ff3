"""The rollout producer service and what it needs: staleness control, tool routing, live weights,
trajectories; the request feeder.
"""
