"""A run, without typer: its config and the settings derived from it, its kinds of service and
the commands serving them, what it needs before it starts (world, index, policy), its warm start,
and its topology brought up and down."""
