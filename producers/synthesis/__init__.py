"""The data-synthesis agent, its model-backed roles, and its faust processor."""
