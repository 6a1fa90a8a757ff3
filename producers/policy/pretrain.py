"""A short pretraining of the CPU policy, so that it starts where real base models start: able
to read its world's text and to copy from its context.

A real search agent starts from a pretrained LM whose attention already copies names, URLs and
numbers from the context (induction heads); a randomly initialised 1M-parameter policy cannot,
and behaviour cloning alone teaches it to recite frequent names instead of copying the ones in
front of it. Each pretraining sequence is a span, a gap of world text and the span again (spans
from the corpus or of random tokens). The loss is on the repeat only (bar its first token,
which nothing announces): copying is then the one thing a step can learn, and the copying heads
form within ~800 steps instead of never (a loss on every token spent the steps on the
unpredictable first copy). One gap length per batch, log-uniform up to `MAX_GAP`, so the heads
copy across an observation's length as well as across a few words, at little padding cost.
While every span opens its sequence, the heads copy what a sequence began with, not by
content (recipe 2: 92 % copied at the start, 9 % 100 tokens in, 0 % 300 tokens in, where an
agent's pages stand); sequences opening with a lead of text from the first step formed no
copying heads in 1,200 steps. So the heads form first, by the start of a sequence, and once
a probe finds them copying (`heads_copy`), each batch opens with a lead of world text of up to
`lead_limit` tokens, rising to `MAX_LEAD` by the last step: on the learning run's policy
(recipe 3, leads from a fixed 40 % of the steps) 85 % copied at the start, 68 % 100 tokens
in, 21 % 300 tokens in, for 373 s of pretraining instead of 210 (docs/learning.md).
Seeded: the same seed, corpus and steps give the same weights.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

RECIPE = 4  # bumped when the recipe changes, so cached policies of an older one are not reused
MIN_SPAN, MAX_SPAN = 8, 24  # tokens of one span
MAX_GAP = 256  # tokens between the span and its repeat: about one observation
BATCH = 32
LR = 1e-3
WARMUP_STEPS = 100
IGNORE = -100  # the label a loss skips
MAX_LEAD = 400  # tokens of world text before the span, at most, by the last step
PROBE_EVERY = 50  # steps between probes of whether the copying heads have formed
HEADS_FORMED = 0.5  # the probe's copy accuracy from which leads begin
FAR_LEAD = 300  # tokens before the span where `copy_far` probes: about where an agent's pages start

Progress = Callable[[int, int, float], None]


def copy_batch(
    corpus: Sequence[int],
    vocab_size: int,
    rng: random.Random,
    count: int,
    pad: int,
    random_share: float = 0.5,
    lead: int = 0,
) -> tuple[list[list[int]], list[list[int]]]:
    """`count` sequences `span + gap + span` and their labels (the repeat bar its first token),
    padded with `pad` to one length. `random_share` of the spans are random ids of the learned
    vocabulary (no bytes, no tags), the rest come from the corpus; the gaps are corpus text,
    all of one length. With `lead`, each sequence opens with that many tokens of corpus text."""
    gap_length = max(1, int(math.exp(rng.uniform(0.0, math.log(MAX_GAP)))))
    rows = []
    for _ in range(count):
        first = rng.randrange(0, len(corpus) - lead) if lead else 0
        opening = list(corpus[first : first + lead])
        n = rng.randint(MIN_SPAN, MAX_SPAN)
        if rng.random() >= random_share:
            start = rng.randrange(0, len(corpus) - n)
            span = list(corpus[start : start + n])
        else:
            span = [rng.randrange(257, vocab_size) for _ in range(n)]
        where = rng.randrange(0, len(corpus) - gap_length)
        gap = list(corpus[where : where + gap_length])
        labels = [IGNORE] * (lead + n + len(gap) + 1) + span[1:]
        rows.append((opening + span + gap + span, labels))
    length = max(len(tokens) for tokens, _ in rows)
    tokens = [t + [pad] * (length - len(t)) for t, _ in rows]
    labels = [lab + [IGNORE] * (length - len(lab)) for _, lab in rows]
    return tokens, labels


def pretrain(
    model: PreTrainedModel,
    corpus_ids: Sequence[int],
    steps: int,
    seed: int,
    pad_id: int,
    progress: Progress | None = None,
) -> float:
    """Train `model` in place for `steps` AdamW steps on copy sequences; the last loss."""
    if len(corpus_ids) < 4 * MAX_GAP:
        raise ValueError(f"the corpus has {len(corpus_ids)} tokens: too few to pretrain on")
    rng = random.Random(f"{seed}:pretrain")
    vocab = model.config.vocab_size
    done, leads_from = 0, None

    def next_batch() -> tuple[list[list[int]], list[list[int]]]:
        nonlocal done, leads_from
        if leads_from is None and done and done % PROBE_EVERY == 0:
            leads_from = done if heads_copy(model, vocab, pad_id, seed) else None
        lead = rng.randint(0, lead_limit(done, leads_from, steps))
        done += 1
        return copy_batch(corpus_ids, vocab, rng, BATCH, pad_id, lead=lead)

    return fit(model, next_batch, steps, seed, progress)


def heads_copy(model: PreTrainedModel, vocab_size: int, pad_id: int, seed: int) -> bool:
    """Whether the model already copies most of a repeat at the start of a sequence (a probe
    of 8 sequences; the model is left in training mode)."""
    formed = copy_accuracy(model, vocab_size, pad_id, seed, batches=1) >= HEADS_FORMED
    model.train()
    return formed


def lead_limit(step: int, leads_from: int | None, steps: int) -> int:
    """The longest lead of step `step` of `steps`: none until the copying heads have formed
    (at step `leads_from`; they form fast by the start of a sequence), then rising to
    `MAX_LEAD` by the last step, so that they learn to copy by content."""
    if leads_from is None or step < leads_from:
        return 0
    return int(MAX_LEAD * (step - leads_from + 1) / max(1, steps - leads_from))


def fit(
    model: PreTrainedModel,
    next_batch: Callable[[], tuple[list[list[int]], list[list[int]]]],
    steps: int,
    seed: int,
    progress: Progress | None = None,
) -> float:
    """`steps` AdamW steps (warmed up, clipped) on the batches `next_batch` makes, with torch
    seeded by `seed` and the caller's RNG state left as it was; the last loss."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS)
    )
    loss_value = float("nan")
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(steps):
            tokens, labels = next_batch()
            loss = labelled_loss(model, torch.tensor(tokens), torch.tensor(labels))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            warmup.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = float(loss.detach())
            if progress is not None:
                progress(step + 1, steps, loss_value)
    model.eval()
    return loss_value


def labelled_loss(
    model: PreTrainedModel, tokens: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """The mean next-token loss on the labelled positions (transformers' causal LM loss), with
    the output layer and the softmax run at those positions alone: a batch labels a repeat of
    ~16 tokens in sequences of hundreds, and the rest of the logits cost a quarter of a step."""
    import torch

    hidden = model.get_decoder()(input_ids=tokens).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    keep = targets != IGNORE
    logits = model.get_output_embeddings()(hidden[keep]).float()
    return torch.nn.functional.cross_entropy(logits, targets[keep])


def copy_accuracy(
    model: PreTrainedModel,
    vocab_size: int,
    pad_id: int,
    seed: int = 0,
    batches: int = 8,
    lead: int = 0,
) -> float:
    """How often the model's greedy next token is right on the repeat of random-token spans
    across gaps of random tokens: ~0 for a policy that cannot copy, near 1 once copying heads
    have formed. Random spans only: a corpus span could be recalled rather than copied. With a
    `lead`, that many random tokens come first: heads that copy only what a sequence began with
    score 0 there, as they do in an agent's context, whose pages stand hundreds of tokens in."""
    import torch

    rng = random.Random(f"{seed}:copy-probe")
    filler = [rng.randrange(257, vocab_size) for _ in range(4 * MAX_GAP)]
    right = total = 0
    model.eval()
    for _ in range(batches):
        tokens, labels = copy_batch(filler, vocab_size, rng, 8, pad_id, random_share=1.0)
        first = [rng.randrange(257, vocab_size) for _ in range(lead)]
        tokens = [first + row for row in tokens]
        targets = torch.tensor([[IGNORE] * lead + row for row in labels])[:, 1:]
        with torch.no_grad():
            guesses = model(torch.tensor(tokens)).logits[:, :-1].argmax(-1)
        scored = targets != IGNORE
        right += int(((guesses == targets) & scored).sum())
        total += int(scored.sum())
    return right / total
