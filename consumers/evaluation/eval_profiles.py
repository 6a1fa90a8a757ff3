"""Evaluation profiles: the budgets, sampling and scoring an evaluation runs with, by name.

"reference" is the reference's evaluation protocol, the one behind the paper's Avg@4 / Pass@4
tables (`evaluation/search_eval_async.py` and its scripts): 4 samples per question at
temperature 0.6 and top-p 0.95, up to 4,096 tokens per LLM call and 64 calls per question (its
`asearcher` agent), answers scored by its rules (`consumers.reward.evaluation_scoring`).
"training" keeps the small budgets a CPU policy can afford and scores as the training reward.
"""

from __future__ import annotations

import msgspec

from asearcher.streams.wire.events import Scoring


class EvalProfile(msgspec.Struct, frozen=True, kw_only=True):
    """How an evaluation samples and scores."""

    k: int  # samples per question (Avg@k, Pass@k)
    temperature: float
    top_p: float
    max_turns: int  # LLM calls per trajectory at most
    max_new_tokens: int  # tokens per call at most
    scoring: Scoring  # "reference": the reference evaluation's rules; "training": the reward's


EVAL_PROFILES: dict[str, EvalProfile] = {
    "reference": EvalProfile(
        k=4, temperature=0.6, top_p=0.95, max_turns=64, max_new_tokens=4096, scoring="reference"
    ),
    "training": EvalProfile(
        k=4, temperature=0.6, top_p=0.95, max_turns=16, max_new_tokens=128, scoring="training"
    ),
}
DEFAULT_PROFILE = "reference"


def eval_profile(name: str) -> EvalProfile:
    """The profile called `name`; ValueError naming the choices otherwise."""
    if name not in EVAL_PROFILES:
        raise ValueError(f"--profile must be one of {', '.join(EVAL_PROFILES)}, not {name!r}")
    return EVAL_PROFILES[name]
