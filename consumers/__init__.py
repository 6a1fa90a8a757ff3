"""Services and logic that answer the agent, by role: tools (search and browse), world (the
synthetic world), formats (actions, prompts, QA files), scoring (rewards, judges), evaluation,
observability (metrics, the run ledger), synthesis (roles and statistics).
"""
