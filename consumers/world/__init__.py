"""A deterministic synthetic world: a fictional encyclopedia with multi-hop questions."""
