"""A run, without typer: its config and the settings derived from it, what it needs before it
starts (world, index, policy), its warm start, and its topology brought up and down."""
