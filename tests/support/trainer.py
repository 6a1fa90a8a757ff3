"""Shared pieces of the trainer tests: a tiny model and rewarded trajectories over it."""

from __future__ import annotations

from pathlib import Path

import torch

from asearcher.streams.wire.events import TrajectoryFinished, new_id
from asearcher.trainer.policy.batching import Group
from asearcher.trainer.policy.sequences import micro_batch, token_logprobs


def tiny_model_dir(root: Path) -> Path:
    from asearcher.consumers.world.world import generate_world, write_world
    from asearcher.producers.policy.model_init import init_model

    world = generate_world(seed=4, entities=40, questions=10)
    corpus = write_world(world, root / "world")["corpus"]
    return init_model(root / "model", corpus, hidden_size=64, layers=2, seed=1)


def completion(prompt: list[int], tail: list[int], reward: float, group: str, size: int,
               version: int = 0) -> TrajectoryFinished:  # fmt: skip
    """A trajectory whose policy-written tokens are `tail`, with placeholder log-probs."""
    ids = prompt + tail
    return TrajectoryFinished(
        trajectory_id=new_id(), group_id=group, question_id=group, token_ids=ids,
        logprobs=[0.0] * len(ids), loss_mask=[0] * len(prompt) + [1] * len(tail),
        token_versions=[-1] * len(prompt) + [version] * len(tail),
        prompt_length=len(prompt), reward=reward, group_size=size,
    )  # fmt: skip


def with_behaviour_logprobs(model: torch.nn.Module, trajectory: TrajectoryFinished):
    """`trajectory` with log-probs the model gives its tokens now (on-policy samples)."""
    import msgspec

    with torch.no_grad():
        logprobs = token_logprobs(model, micro_batch([trajectory], [0.0]))[0]
    return msgspec.structs.replace(trajectory, logprobs=[float(x) for x in logprobs])


def tail_logprob(model: torch.nn.Module, trajectory: TrajectoryFinished) -> float:
    """Summed log-prob of the policy-written tokens under `model`."""
    with torch.no_grad():
        logprobs = token_logprobs(model, micro_batch([trajectory], [0.0]))[0]
    mask = torch.tensor(trajectory.loss_mask, dtype=torch.float32)
    return float((logprobs * mask).sum())


def rewarded_groups(model, groups: int, seed: int = 0) -> tuple[list[Group], list, list]:
    """Groups of two: the same prompt, a rewarded and an unrewarded completion."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    batch, good, bad = [], [], []
    for number in range(groups):
        prompt = torch.randint(1, vocab, (12,), generator=generator).tolist()
        tails = [torch.randint(1, vocab, (6,), generator=generator).tolist() for _ in range(2)]
        name = f"g{number}"
        winner = with_behaviour_logprobs(model, completion(prompt, tails[0], 1.0, name, 2))
        loser = with_behaviour_logprobs(model, completion(prompt, tails[1], 0.0, name, 2))
        batch.append(Group(group_id=name, trajectories=[winner, loser]))
        good.append(winner)
        bad.append(loser)
    return batch, good, bad
