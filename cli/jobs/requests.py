"""Rollout requests from a QA file, validated as a producer would (`rollout request`, `demo`)."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from asearcher.cli.errors import CliError
from asearcher.cli.wiring import as_cli_error

if TYPE_CHECKING:
    from asearcher.streams.wire.events import SamplingSettings


def request_events(
    qa: Path,
    limit: int | None,
    group_size: int,
    max_turns: int,
    max_new_tokens: int,
    temperature: float,
    purpose: str,
    seed: int,
) -> list:
    """RolloutRequested events for `limit` questions of `qa` (all if None), validated like a
    producer would."""
    from asearcher.consumers.formats.qa_files import read_qa_file
    from asearcher.producers.agents.agent import check_request

    if purpose not in ("train", "eval", "synthesis"):
        raise CliError(f"--purpose must be train, eval or synthesis, not {purpose!r}")
    if limit is not None and limit < 1:
        raise CliError(f"--limit must be at least 1, got {limit}")
    sampling = checked_sampling(group_size, max_turns, max_new_tokens, temperature, purpose)
    if not qa.is_file():
        raise CliError(f"--qa {qa} is not a file")
    with as_cli_error(ValueError):
        questions = read_qa_file(str(qa))
    if limit is not None and limit > len(questions):
        raise CliError(f"--limit {limit} exceeds the {len(questions)} questions in {qa}")
    picked = questions if limit is None else random.Random(seed).sample(questions, limit)
    events = []
    for item in picked:
        event = item.request(
            group_id=uuid.uuid4().hex,
            sampling=sampling,
            group_size=group_size,
            purpose=purpose,  # type: ignore[arg-type]
        )
        with as_cli_error(ValueError):
            check_request(event)
        events.append(event)
    return events


# The request fields the `request` options set, for errors that name the option typed.
_OPTION_OF_FIELD = {
    "group_size": "--group-size",
    "sampling.max_turns": "--max-turns",
    "sampling.max_new_tokens_per_turn": "--max-new-tokens",
    "sampling.temperature": "--temperature",
}


def checked_sampling(
    group_size: int, max_turns: int, max_new_tokens: int, temperature: float, purpose: str
) -> SamplingSettings:
    """The sampling settings of the options, refused as a producer would refuse them."""
    from asearcher.producers.agents.agent import BadRequest, check_sampling
    from asearcher.streams.wire.events import SamplingSettings

    if purpose == "train" and temperature == 0:
        # Greedy: every trajectory of a group is the same, so every group is flat and dropped.
        raise CliError("--temperature: must be above 0 for train requests (0 is greedy), got 0.0")
    sampling = SamplingSettings(
        temperature=temperature, max_new_tokens_per_turn=max_new_tokens, max_turns=max_turns
    )
    try:
        check_sampling(sampling, group_size)
    except BadRequest as exc:
        raise CliError(f"{_OPTION_OF_FIELD.get(exc.field, exc.field)}: {exc}") from exc
    return sampling
