"""The few collectives the trainer needs, each a no-op in a single process.

Rank 0 is the only one that talks to Kafka and the weight store; these carry its decisions and
the step's totals to and from the other ranks.
"""

from __future__ import annotations

from typing import Any

import torch


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


def leave_world() -> None:
    """Leave a multi-process group together: wait for every rank, then destroy the group.

    A rank that exits with gloo's worker threads still alive aborts at interpreter shutdown
    ("terminate called without an active exception", SIGABRT; pytorch/pytorch#190489), and
    rank 0 hosts the group's store, so no rank may leave before the others have arrived.
    """
    _, world = rank_and_world()
    if world == 1:
        return
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
