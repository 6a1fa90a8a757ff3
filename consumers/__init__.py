"""Tool workers (search and browse backends) and reward scoring."""
