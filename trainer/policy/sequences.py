"""Turn trajectories into tensors and per-token log-probs, the way the engines computed them.

A trajectory holds one or more training sequences back to back (`sequence_starts`): each is an
LLM call's exact context and output, so each becomes its own row and no token attends across
sequences. A micro-batch is a list of such rows, right-padded to the longest. Log-probs are those
of each token given its row's prefix, from logits divided by the trajectory's sampling
temperature (what the engine sampled from): a row's position 0 has none and gets 0, as do
padding positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asearcher.streams.wire.events import TrajectoryFinished


@dataclass(frozen=True)
class Row:
    """One training sequence: a slice of a trajectory's per-token lists, with its advantage."""

    trajectory: TrajectoryFinished
    start: int
    end: int
    advantage: float

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def trained_tokens(self) -> int:
        """Loss tokens of the row; its first token has no prefix and is never trained."""
        return sum(self.trajectory.loss_mask[self.start + 1 : self.end])


def sequence_bounds(trajectory: TrajectoryFinished) -> list[tuple[int, int]]:
    """(start, end) of each training sequence of `trajectory` in its per-token lists."""
    edges = [0, *trajectory.sequence_starts, len(trajectory.token_ids)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def training_rows(
    trajectories: Sequence[TrajectoryFinished], advantages: Sequence[float]
) -> list[Row]:
    """Every training sequence of `trajectories`, in order, each with its trajectory's advantage."""
    return [
        Row(trajectory, start, end, advantage)
        for trajectory, advantage in zip(trajectories, advantages, strict=True)
        for start, end in sequence_bounds(trajectory)
    ]


@dataclass
class MicroBatch:
    """Padded tensors of a few training sequences, shape [rows, length]."""

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
    """Pad every training sequence of `trajectories` into one micro-batch, a row each;
    `advantages` holds one value per trajectory."""
    return rows_batch(training_rows(trajectories, advantages))


def rows_batch(rows: Sequence[Row]) -> MicroBatch:
    """Pad `rows` into one micro-batch."""
    length = max(row.length for row in rows)
    count = len(rows)
    ids = torch.zeros(count, length, dtype=torch.long)
    attention = torch.zeros(count, length, dtype=torch.long)
    mask = torch.zeros(count, length, dtype=torch.float32)
    behaviour = torch.zeros(count, length, dtype=torch.float32)
    for index, row in enumerate(rows):
        n, part = row.length, slice(row.start, row.end)
        ids[index, :n] = torch.tensor(row.trajectory.token_ids[part], dtype=torch.long)
        attention[index, :n] = 1
        mask[index, :n] = torch.tensor(row.trajectory.loss_mask[part], dtype=torch.float32)
        behaviour[index, :n] = torch.tensor(row.trajectory.logprobs[part], dtype=torch.float32)
    mask[:, 0] = 0.0  # the first token has no prefix to be predicted from
    per_row = torch.tensor([row.advantage for row in rows], dtype=torch.float32).unsqueeze(1)
    temperatures = torch.tensor(
        [_temperature(row.trajectory) for row in rows], dtype=torch.float32
    ).unsqueeze(1)
    return MicroBatch(ids, attention, mask, behaviour, per_row * mask, temperatures)


def _temperature(trajectory: TrajectoryFinished) -> float:
    # Greedy turns (temperature 0) report log_softmax of the raw logits, as temperature 1 does.
    return trajectory.temperature if trajectory.temperature > 0 else 1.0


def token_logprobs(
    model: torch.nn.Module, batch: MicroBatch, trained_only: bool = False
) -> torch.Tensor:
    """log p(token_t | tokens_<t) for every position, 0 at position 0 and on padding; with
    `trained_only`, 0 also off the loss mask, where nothing reads them (cheaper: see
    `_trained_logprobs`)."""
    if trained_only and _plain_head(model):
        return _trained_logprobs(_unwrapped(model), batch)
    logits = model(input_ids=batch.token_ids, attention_mask=batch.attention_mask).logits
    logits = logits[:, :-1].float() / batch.temperatures.unsqueeze(-1)
    logprobs = _logprobs_of(logits, batch.token_ids[:, 1:])
    logprobs = torch.nn.functional.pad(logprobs, (1, 0))
    return logprobs * batch.attention_mask


def _logprobs_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log-softmax of `logits` at `targets`, over the last dimension."""
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


# Families whose logits are the output embedding of the decoder's last hidden state, with
# nothing after it (no soft-capping or scaling), so it may be applied to a few positions alone.
PLAIN_HEAD_FAMILIES = frozenset({"qwen2", "qwen3", "llama", "mistral"})


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    # A DeepSpeed engine holds the transformers model as `module`.
    return getattr(model, "module", model)


def _plain_head(model: torch.nn.Module) -> bool:
    # Under ZeRO-3 the engine's own forward orders the gathering of partitioned parameters:
    # the decoder and head called apart from it trained the wrong way (test_trainer_step).
    stage = getattr(model, "zero_optimization_stage", None)
    if stage is not None and stage() == 3:
        return False
    config = getattr(_unwrapped(model), "config", None)
    return getattr(config, "model_type", None) in PLAIN_HEAD_FAMILIES


def _trained_logprobs(model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
    """`token_logprobs` on the loss mask alone: the output layer and the softmax over the
    vocabulary run at the positions that predict a trained token, not at every one. A
    trajectory's trained tokens (what the policy wrote) are ~10 % of it beside its prompt and
    observations; on the CPU policy a cloning pass takes 0.76 of its time this way
    (bench_training_passes)."""
    hidden = model.get_decoder()(
        input_ids=batch.token_ids, attention_mask=batch.attention_mask
    ).last_hidden_state[:, :-1]
    keep = batch.loss_mask[:, 1:] > 0
    logits = model.get_output_embeddings()(hidden[keep]).float()
    logits = logits / batch.temperatures.expand_as(keep)[keep].unsqueeze(-1)
    picked = _logprobs_of(logits, batch.token_ids[:, 1:][keep])
    logprobs = torch.zeros(keep.shape, dtype=picked.dtype, device=picked.device)
    return torch.nn.functional.pad(logprobs.masked_scatter(keep, picked), (1, 0))


def trajectory_logprobs(model: torch.nn.Module, trajectory: TrajectoryFinished) -> list[float]:
    """The trainer's log-prob of every token of `trajectory`, aligned with its per-token lists
    (0 at the first token of each training sequence): what it compares with `logprobs`."""
    batch = micro_batch([trajectory], [0.0])
    with torch.no_grad():
        rows = token_logprobs(model, batch)
    flat: list[float] = []
    for row, (start, end) in zip(rows, sequence_bounds(trajectory), strict=True):
        flat += [float(x) for x in row[: end - start]]
    return flat
