"""Jobs behind commands, without typer: the main job behind `learn`, evaluating a version, plots,
rollout requests, chaos and its resource samples, the configuration reference, synthesis plots."""
