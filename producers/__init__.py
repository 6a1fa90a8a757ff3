"""What plays and feeds rollouts, by role: rollout (the producer service, staleness, the feeder),
agents (workflows and prompts), engines (inference), synthesis (the data-synthesis agent),
policy (creating, importing and pretraining the policy).
"""
