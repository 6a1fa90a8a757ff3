"""The data-synthesis agent's roles as protocols, the rule-based roles on the world, statistics."""
