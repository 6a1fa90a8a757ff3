"""The typer application `asearcher`."""
