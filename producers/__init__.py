"""Rollout producers: the agent loop, prompts, action parsing and inference engines."""
