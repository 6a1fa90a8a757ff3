"""The CPU policy's pretraining: its copy sequences and reading items, that it forms copying
heads, and that reading lowers the loss on an unseen world's answers."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from asearcher.consumers.world.world import generate_world, write_world
from asearcher.producers.policy.model_init import PolicySpec, init_model, read_pretraining
from asearcher.producers.policy.pretrain import (
    FAR_LEAD,
    IGNORE,
    MAX_GAP,
    MAX_LEAD,
    MAX_SPAN,
    MIN_SPAN,
    copy_accuracy,
    copy_batch,
    labelled_loss,
    lead_limit,
)
from asearcher.producers.policy.reading import (
    FIRST_WORLD_SEED,
    PROBE_ITEMS,
    ReadingItem,
    probe_items,
    reading_accuracy,
    reading_batch,
    training_items,
    world_items,
)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Train in this process on one thread. Beside a whole run on the other xdist worker, two
    OpenMP threads wait on each other whenever one is descheduled: the copying-heads test took
    over 300 s there (a rehearsal, 2026-11-29) against 53 s alone."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


CORPUS = list(range(300, 2300))
PAD = 0


def test_a_batch_repeats_each_span_after_one_shared_gap_and_scores_only_the_repeat() -> None:
    tokens, labels = copy_batch(CORPUS, 4000, random.Random(3), 16, PAD)
    assert len({len(row) for row in tokens}) == 1 and len(labels) == 16
    gaps = set()
    for row, label in zip(tokens, labels, strict=True):
        scored = [i for i, value in enumerate(label) if value != IGNORE]
        span = [label[i] for i in scored]
        repeat_start = scored[0] - 1  # the repeat's first token is not scored
        n = len(span) + 1
        assert row[repeat_start : repeat_start + n] == row[:n]  # the span, again
        assert span == row[1:n]
        gaps.add(repeat_start - n)
        assert all(t == PAD for t in row[repeat_start + n :])
        assert all(value == IGNORE for value in label[repeat_start + n :])
    assert len(gaps) == 1 and 1 <= gaps.pop() <= MAX_GAP


def test_a_lead_of_corpus_text_opens_every_sequence_and_is_never_scored() -> None:
    lead = 37
    tokens, labels = copy_batch(CORPUS, 4000, random.Random(4), 8, PAD, lead=lead)
    for row, label in zip(tokens, labels, strict=True):
        opening = row[:lead]
        assert opening == CORPUS[opening[0] - 300 : opening[0] - 300 + lead]  # corpus text
        assert all(value == IGNORE for value in label[: lead + MIN_SPAN + 1])
        scored = [i for i, value in enumerate(label) if value != IGNORE]
        n = len(scored) + 1
        assert row[scored[0] - 1 : scored[0] - 1 + n] == row[lead : lead + n]  # the span again


def test_leads_start_once_the_heads_formed_and_rise_to_the_longest_by_the_last_step() -> None:
    steps, formed = 1000, 350
    assert lead_limit(999, None, steps) == 0  # heads never formed: no leads
    assert [lead_limit(step, formed, steps) for step in (0, formed - 1)] == [0, 0]
    limits = [lead_limit(step, formed, steps) for step in range(formed, steps)]
    assert limits == sorted(limits) and limits[0] < 5 and limits[-1] == MAX_LEAD


def test_the_loss_on_labelled_positions_alone_is_the_causal_lm_loss_with_its_gradients() -> None:
    import torch

    from asearcher.producers.policy.model_init import build_model

    model = build_model(
        2400, PAD, hidden_size=64, layers=2, heads=1, kv_heads=1, intermediate_size=192,
        max_positions=2048, seed=0,
    ).train()  # fmt: skip
    tokens, labels = copy_batch(CORPUS, 2400, random.Random(3), 4, PAD, lead=20)
    tokens, labels = torch.tensor(tokens), torch.tensor(labels)
    head_rows: list[int] = []
    model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: head_rows.append(args[0].shape[:-1].numel())
    )
    losses, grads = [], []
    for loss_of in (lambda: model(tokens, labels=labels).loss,
                    lambda: labelled_loss(model, tokens, labels)):  # fmt: skip
        model.zero_grad()
        loss = loss_of()
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append([p.grad.clone() for p in model.parameters()])
    assert abs(losses[0] - losses[1]) < 1e-5
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))
    # The output layer ran at every position, then at the labelled ones alone.
    assert head_rows == [tokens.numel(), int((labels[:, 1:] != IGNORE).sum())]


def test_random_spans_use_only_learned_ids_and_corpus_spans_come_from_the_corpus() -> None:
    tokens, labels = copy_batch(CORPUS, 4000, random.Random(5), 16, PAD, random_share=1.0)
    spans = [[v for v in label if v != IGNORE] for label in labels]
    assert all(257 <= t < 4000 for span in spans for t in span)
    assert any(t >= 2300 for span in spans for t in span)  # not from the corpus
    tokens, labels = copy_batch(CORPUS, 4000, random.Random(5), 16, PAD, random_share=0.0)
    for row, label in zip(tokens, labels, strict=True):
        start = CORPUS.index(row[0])
        span = [v for v in label if v != IGNORE]
        assert CORPUS[start + 1 : start + 1 + len(span)] == span  # a contiguous corpus span


def test_a_too_short_corpus_is_refused_with_its_size(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"url": "u", "title": "T", "contents": "a few words"}\n')
    with pytest.raises(ValueError, match="too few to pretrain on"):
        init_model(tmp_path / "m", corpus, vocab_size=400, hidden_size=64, layers=1,
                   heads=1, kv_heads=1, intermediate_size=128, pretrain_steps=5)  # fmt: skip


def _tiny_policy(tmp_path: Path, name: str, **steps: int) -> Path:
    """The smallest shape with a previous-token layer and a copying layer, over a small world."""
    corpus = tmp_path / "corpus.jsonl"
    if not corpus.is_file():
        write_world(generate_world(0, entities=60, questions=20, filler=False), tmp_path)
    spec = PolicySpec(vocab_size=1024, hidden_size=64, layers=2, **steps)
    return init_model(tmp_path / name, corpus, seed=1, **spec.init_kwargs())


@pytest.mark.slow
def test_pretraining_forms_copying_heads_the_random_policy_lacks(tmp_path: Path) -> None:
    model = _tiny_policy(tmp_path, "policy", pretrain_steps=1000)  # ~1 minute
    report = read_pretraining(model)
    assert report is not None and report.steps == 1000
    assert report.copy_before < 0.1
    assert report.copy_after > 0.6, report
    assert report.copy_far is not None and 0.0 <= report.copy_far <= 1.0


class _Copier:
    """A stand-in model that predicts the token after the latest earlier occurrence of the
    current one, looking back over the whole sequence (`window` None: an induction head) or only
    over its first `window` tokens (heads that copy what a sequence began with)."""

    def __init__(self, vocab_size: int, window: int | None = None) -> None:
        self.vocab_size, self.window = vocab_size, window

    def eval(self) -> None:
        pass

    def __call__(self, ids):
        import torch

        rows = ids.tolist()
        logits = torch.zeros(len(rows), len(rows[0]), self.vocab_size)
        for b, row in enumerate(rows):
            for i, token in enumerate(row):
                seen = row[: i if self.window is None else min(i, self.window)]
                earlier = [j for j, t in enumerate(seen) if t == token and j + 1 < len(row)]
                if earlier:
                    logits[b, i, row[earlier[-1] + 1]] = 1.0
        return SimpleNamespace(logits=logits)


def test_the_far_copy_probe_tells_copying_heads_from_copying_the_start() -> None:
    induction, start_only = _Copier(1024), _Copier(1024, window=MAX_SPAN + 1)
    assert copy_accuracy(induction, 1024, PAD, batches=2) > 0.75
    assert copy_accuracy(start_only, 1024, PAD, batches=2) > 0.75
    assert copy_accuracy(induction, 1024, PAD, batches=2, lead=FAR_LEAD) > 0.75
    assert copy_accuracy(start_only, 1024, PAD, batches=2, lead=FAR_LEAD) < 0.1


def _words(text: str) -> list[int]:
    """A stand-in tokenizer for the item tests: one id per character."""
    return [ord(c) for c in text]


def test_a_reading_item_is_its_question_then_its_pages_and_the_answer_is_on_them() -> None:
    items = world_items(FIRST_WORLD_SEED, _words, eos=0)
    assert len(items) > 300
    for prompt, answer in items[:50]:
        text = "".join(map(chr, prompt))
        assert text.startswith("Question: ") and text.endswith("\nAnswer:")
        assert answer[-1] == 0
        assert "".join(map(chr, answer[:-1])).strip() in text.split("\n\n", 1)[1]


def test_the_probe_world_is_none_of_the_training_worlds() -> None:
    trained = {tuple(prompt) for prompt, _ in training_items(_words, 0, worlds=2)}
    probe = probe_items(_words, 0, worlds=2)
    assert len(probe) == PROBE_ITEMS
    assert not trained & {tuple(prompt) for prompt, _ in probe}


def test_a_reading_batch_scores_the_answers_only() -> None:
    items = [ReadingItem([5, 6, 7], [8, 9]), ReadingItem([5], [10, 11, 12])]
    tokens, labels = reading_batch(items, random.Random(0), 6, PAD)
    assert len({len(row) for row in tokens}) == 1 and len(tokens) == 6
    for row, label in zip(tokens, labels, strict=True):
        scored = [value for value in label if value != IGNORE]
        assert scored in ([8, 9], [10, 11, 12])
        start = label.index(scored[0])
        assert row[start : start + len(scored)] == scored
        assert all(value == IGNORE for value in label[:start])


def test_a_reading_batch_with_a_lead_puts_one_length_of_text_before_every_item() -> None:
    items = [ReadingItem([5, 6, 7], [8, 9]), ReadingItem([5], [10, 11, 12])]
    text = list(range(1000, 1300))
    lengths = set()
    for seed in range(20):
        tokens, labels = reading_batch(items, random.Random(seed), 4, PAD, lead=40, lead_text=text)
        starts = {row.index(5) for row in tokens}  # every item's prompt opens with 5
        assert len(starts) == 1  # one lead length for the batch
        [before] = starts
        lengths.add(before)
        for row, label in zip(tokens, labels, strict=True):
            lead = row[:before]
            assert lead == text[lead[0] - 1000 : lead[0] - 1000 + before] if lead else True
            assert all(value == IGNORE for value in label[: before + 1])  # lead and prompt
            assert [v for v in label if v != IGNORE] in ([8, 9], [10, 11, 12])
    assert max(lengths) <= 40 and len(lengths) > 5  # lengths vary from batch to batch
    plain, _ = reading_batch(items, random.Random(0), 4, PAD)
    assert all(row[0] == 5 for row in plain)  # without a lead the item opens the sequence


def test_the_far_reading_probe_tells_reading_by_content_from_reading_the_start() -> None:
    # The stand-ins answer with the token that followed the prompt's last token earlier on.
    induction, start_only = _Copier(1024), _Copier(1024, window=4)
    items = [ReadingItem([300 + i, 400 + i, 300 + i], [400 + i]) for i in range(8)]
    assert reading_accuracy(induction, items) == 1.0
    assert reading_accuracy(start_only, items) == 1.0
    assert reading_accuracy(induction, items, lead=FAR_LEAD, vocab_size=257 + 8) == 1.0
    assert reading_accuracy(start_only, items, lead=FAR_LEAD, vocab_size=257 + 8) == 0.0


@pytest.mark.slow
def test_reading_pretraining_lowers_the_answer_loss_on_an_unseen_world(tmp_path: Path) -> None:
    import torch

    model_dir = _tiny_policy(tmp_path, "policy", reading_steps=150)
    report = read_pretraining(model_dir)
    assert report is not None and report.reading_steps == 150 and report.steps == 0
    assert report.reading_before is not None and report.reading_after is not None

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    probe = probe_items(lambda text: tokenizer(text)["input_ids"], tokenizer.eos_token_id)
    tokens, labels = reading_batch(probe, random.Random(0), 32, tokenizer.eos_token_id)

    def answer_loss(model: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(model(torch.tensor(tokens), labels=torch.tensor(labels)).loss)

    before = answer_loss(AutoModelForCausalLM.from_pretrained(_tiny_policy(tmp_path, "random")))
    after = answer_loss(AutoModelForCausalLM.from_pretrained(model_dir))
    assert after < 0.7 * before, (before, after)
