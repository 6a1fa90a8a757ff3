"""Errors the CLI reports as one line instead of a traceback."""


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""
