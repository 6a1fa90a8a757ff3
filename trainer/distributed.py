"""Data-parallel training over several processes, as DeepSpeed's launcher starts them.

Rank 0 is the only one that talks to Kafka and the weight store: it forms each batch and
broadcasts it; every rank trains on its share of the batch's micro-batches, DeepSpeed averages
the gradients, and all ranks step together. The other ranks run `follow_rank_zero` until rank 0
broadcasts the end.
"""

from __future__ import annotations

from typing import Any

import torch

from asearcher.trainer.batching import Group
from asearcher.trainer.objective import ObjectiveConfig


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of training processes (0, 1 when not distributed)."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def broadcast(value: Any) -> Any:
    """Rank 0's `value`, on every rank (rank 0 passes the value, the others anything)."""
    _, world = rank_and_world()
    if world == 1:
        return value
    holder = [value]
    torch.distributed.broadcast_object_list(holder, src=0)
    return holder[0]


def sum_across_ranks(values: list[float]) -> list[float]:
    """Element-wise sums of `values` over all ranks."""
    _, world = rank_and_world()
    if world == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(tensor)
    return tensor.tolist()


def follow_rank_zero(engine: Any, objective: ObjectiveConfig, micro_batch_tokens: int) -> int:
    """On ranks > 0: train on each batch rank 0 broadcasts, until it broadcasts None."""
    from asearcher.trainer.deepspeed_setup import full_state_dict
    from asearcher.trainer.step import train_on_batch

    steps = 0
    while True:
        batch: list[Group] | None = broadcast(None)
        if batch is None:
            return steps
        train_on_batch(engine, batch, objective, micro_batch_tokens)
        full_state_dict(engine)  # a collective under ZeRO-3: rank 0 gathers the weights
        steps += 1
