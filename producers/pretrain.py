"""A short pretraining of the CPU policy, so that it starts where real base models start: able
to read its world's text and to copy from its context.

A real search agent starts from a pretrained LM whose attention already copies names, URLs and
numbers from the context (induction heads); a randomly initialised 1M-parameter policy cannot,
and behaviour cloning alone teaches it to recite frequent names instead of copying the ones in
front of it. Each pretraining sequence is a span, a short gap and the span again (spans from
the corpus or of random tokens), trained as plain next-token prediction: the second copy is
predictable only by looking back, which is what forms the copying heads. Seeded: the same
seed, corpus and steps give the same weights.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MAX_SPAN = 48  # tokens of one span; a sequence is span + gap + span
MAX_GAP = 16
BATCH = 16
LR = 3e-3

Progress = Callable[[int, int, float], None]


def copy_sequences(
    corpus: Sequence[int], vocab_size: int, rng: random.Random, count: int, pad: int
) -> list[list[int]]:
    """`count` sequences `span + gap + span`, padded with `pad` to one length; half the spans
    come from the corpus, half are random ids of the learned vocabulary (no bytes, no tags)."""
    length = 2 * MAX_SPAN + MAX_GAP
    sequences = []
    for _ in range(count):
        n = rng.randint(8, MAX_SPAN)
        if rng.random() < 0.5:
            start = rng.randrange(0, len(corpus) - n)
            span = list(corpus[start : start + n])
        else:
            span = [rng.randrange(257, vocab_size) for _ in range(n)]
        where = rng.randrange(0, len(corpus) - MAX_GAP)
        gap = list(corpus[where : where + rng.randint(1, MAX_GAP)])
        sequence = span + gap + span
        sequences.append(sequence + [pad] * (length - len(sequence)))
    return sequences


def pretrain(
    model: PreTrainedModel,
    corpus_ids: Sequence[int],
    steps: int,
    seed: int,
    pad_id: int,
    progress: Progress | None = None,
) -> float:
    """Train `model` in place for `steps` AdamW steps on copy sequences; the last loss."""
    import torch

    if len(corpus_ids) < 4 * MAX_SPAN:
        raise ValueError(f"the corpus has {len(corpus_ids)} tokens: too few to pretrain on")
    rng = random.Random(f"{seed}:pretrain")
    vocab = model.config.vocab_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    loss_value = float("nan")
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(steps):
            batch = torch.tensor(copy_sequences(corpus_ids, vocab, rng, BATCH, pad_id))
            labels = batch.masked_fill(batch == pad_id, -100)
            loss = model(batch, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = float(loss.detach())
            if progress is not None:
                progress(step + 1, steps, loss_value)
    model.eval()
    return loss_value
