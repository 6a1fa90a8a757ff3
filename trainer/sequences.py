"""Turn trajectories into tensors and per-token log-probs, the way the engines computed them.

A micro-batch is a list of trajectories, right-padded to its longest sequence. Log-probs are
those of each token given its prefix, from logits divided by the trajectory's sampling
temperature (what the engine sampled from), aligned with `token_ids`: position 0 has none and
gets 0, as do padding positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asearcher.streams.events import TrajectoryFinished


@dataclass
class MicroBatch:
    """Padded tensors of a few trajectories, shape [batch, length]."""

    token_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    temperatures: torch.Tensor  # [batch, 1]

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same micro-batch on `device` (the engine's)."""
        return MicroBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def micro_batch(
    trajectories: Sequence[TrajectoryFinished], advantages: Sequence[float]
) -> MicroBatch:
    """Pad `trajectories` into one micro-batch; `advantages` holds one value per trajectory."""
    length = max(len(t.token_ids) for t in trajectories)
    rows = len(trajectories)
    ids = torch.zeros(rows, length, dtype=torch.long)
    attention = torch.zeros(rows, length, dtype=torch.long)
    mask = torch.zeros(rows, length, dtype=torch.float32)
    behaviour = torch.zeros(rows, length, dtype=torch.float32)
    for row, trajectory in enumerate(trajectories):
        n = len(trajectory.token_ids)
        ids[row, :n] = torch.tensor(trajectory.token_ids)
        attention[row, :n] = 1
        mask[row, :n] = torch.tensor(trajectory.loss_mask, dtype=torch.float32)
        behaviour[row, :n] = torch.tensor(trajectory.logprobs, dtype=torch.float32)
    mask[:, 0] = 0.0  # the first token has no prefix to be predicted from
    per_row = torch.tensor(list(advantages), dtype=torch.float32).unsqueeze(1)
    temperatures = torch.tensor(
        [_temperature(t) for t in trajectories], dtype=torch.float32
    ).unsqueeze(1)
    return MicroBatch(ids, attention, mask, behaviour, per_row * mask, temperatures)


def _temperature(trajectory: TrajectoryFinished) -> float:
    # Greedy turns (temperature 0) report log_softmax of the raw logits, as temperature 1 does.
    return trajectory.temperature if trajectory.temperature > 0 else 1.0


def token_logprobs(model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
    """log p(token_t | tokens_<t) for every position, 0 at position 0 and on padding."""
    logits = model(input_ids=batch.token_ids, attention_mask=batch.attention_mask).logits
    logits = logits[:, :-1].float() / batch.temperatures.unsqueeze(-1)
    targets = batch.token_ids[:, 1:]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    logprobs = picked - torch.logsumexp(logits, dim=-1)
    logprobs = torch.nn.functional.pad(logprobs, (1, 0))
    return logprobs * batch.attention_mask
