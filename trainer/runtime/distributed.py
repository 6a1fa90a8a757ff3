"""Data-parallel training over several processes, as DeepSpeed's launcher starts them.

Rank 0 is the only one that talks to Kafka and the weight store: it forms each batch and
broadcasts it; every rank trains on its share of the batch's micro-batches, DeepSpeed averages
the gradients, and all ranks step together. The other ranks run `follow_rank_zero` until rank 0
broadcasts the end; then every rank leaves the process group together.
"""

from __future__ import annotations

from typing import Any

from asearcher.trainer.policy.batching import Group
from asearcher.trainer.policy.objective import ObjectiveConfig
from asearcher.trainer.policy.step import train_on_batch
from asearcher.trainer.runtime.collectives import broadcast, leave_world
from asearcher.trainer.runtime.deepspeed_setup import full_state_dict


def follow_rank_zero(engine: Any, objective: ObjectiveConfig, micro_batch_tokens: int) -> int:
    """On ranks > 0: train on each batch rank 0 broadcasts, until it broadcasts None; then
    leave the process group with rank 0 (`TrainerService.close`)."""
    steps = 0
    while True:
        batch: list[Group] | None = broadcast(None)
        if batch is None:
            leave_world()
            return steps
        train_on_batch(engine, batch, objective, micro_batch_tokens)
        full_state_dict(engine)  # a collective under ZeRO-3: rank 0 gathers the weights
        steps += 1
