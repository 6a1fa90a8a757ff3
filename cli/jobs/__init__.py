"""Jobs behind commands, without typer: evaluating a version, plots, rollout requests, chaos
and its resource samples, the configuration reference, synthesis plots."""
