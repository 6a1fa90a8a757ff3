"""Evaluators under test: their private topics."""

from __future__ import annotations

import msgspec

from asearcher.producers.rollout.service import RolloutTopics
from tests.support.rollout import fresh_topics


def eval_topics(make_topic) -> RolloutTopics:
    """Private copies of an evaluator's topics: eval requests in, eval trajectories out."""
    return msgspec.structs.replace(
        fresh_topics(make_topic),
        requests=make_topic(like="eval.requests"),
        trajectories=make_topic(like="eval.trajectories"),
    )
