"""One logger setup for every service: rich console output, levels from the CLI."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.logging import RichHandler

ROOT = "asearcher"


def get_logger(name: str) -> logging.Logger:
    """The logger for module `name`, under the `asearcher` hierarchy."""
    return logging.getLogger(name if name.startswith(ROOT) else f"{ROOT}.{name}")


def configure_logging(level: str = "INFO") -> None:
    """Send asearcher's logs to stderr through rich; safe to call more than once."""
    root = logging.getLogger(ROOT)
    root.setLevel(level.upper())
    if not any(isinstance(h, RichHandler) for h in root.handlers):
        handler = RichHandler(
            console=Console(stderr=True),  # rich's default is stdout, where commands print
            show_path=False, rich_tracebacks=True, log_time_format="%H:%M:%S",
        )  # fmt: skip
        root.addHandler(handler)


@contextmanager
def quieter(*names: str, level: int = logging.WARNING) -> Iterator[None]:
    """Raise the level of loggers `names` (under `asearcher`) for the block: services a
    command runs in-process log per request, which its own progress display already says."""
    loggers = [get_logger(name) for name in names]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(level, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        for logger, old in zip(loggers, before, strict=True):
            logger.setLevel(old)
