"""Errors the CLI reports as one line instead of a traceback."""

from collections.abc import Iterator
from contextlib import contextmanager


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


@contextmanager
def as_cli_error(*kinds: type[Exception], os_error: str | None = None) -> Iterator[None]:
    """Turn errors of `kinds` raised inside into a one-line `CliError` with their message.

    With `os_error`, an OSError reads "os_error: strerror" ("cannot write the world into w:
    Not a directory"): the strerror alone does not say what failed.
    """
    try:
        yield
    except kinds as exc:
        if os_error is not None and isinstance(exc, OSError):
            raise CliError(f"{os_error}: {exc.strerror or exc}") from exc
        raise CliError(str(exc)) from exc
