"""The CPU engine's throughput by batch size: whether batching more calls than 8 would pay.

The learning run's policy shape (vocabulary, width and depth of its recipe's `[policy]`),
untrained (it rarely writes its end token, so each size decodes about the same tokens), one
torch thread as a service sharing 2 cores has, 32 calls at once with prompts of 150-450 tokens
(an agent's context after a page) and 64 new tokens each (the run's turn limit), at the run's
temperature. Each size is measured `ROUNDS` times, the sizes interleaved and their order
reversed every round, so that the machine's drift falls on all of them; the table gives
tokens/s and the ratio to 8, the engine's batch (`max_batch`).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path

import pytest
from harness import show_table, write_results

from asearcher.cli.jobs.learning import learning_run_file
from asearcher.cli.run.config import load_run_config
from asearcher.consumers.world.world import generate_world, write_world
from asearcher.producers.engines.base import GenerateParams
from asearcher.producers.engines.hf_engine import TransformersEngine
from asearcher.producers.policy.model_init import init_model

pytestmark = pytest.mark.benchmark

BATCHES = (4, 8, 16, 32)
CALLS = 32
NEW_TOKENS = 64
ROUNDS = 3


async def _decode(engine: TransformersEngine, vocab: int, seed: int) -> int:
    """Tokens written by `CALLS` calls sent at once."""
    rng = random.Random(seed)
    lengths = [rng.randint(150, 450) for _ in range(CALLS)]
    prompts = [[rng.randrange(257, vocab) for _ in range(n)] for n in lengths]
    params = [
        GenerateParams(temperature=0.7, max_new_tokens=NEW_TOKENS, seed=seed * CALLS + i)
        for i in range(CALLS)
    ]
    calls = (engine.generate(p, s) for p, s in zip(prompts, params, strict=True))
    done = await asyncio.gather(*calls)
    return sum(len(g.token_ids) for g in done)


def test_engine_tokens_per_second_by_batch(tmp_path: Path) -> None:
    files = write_world(generate_world(seed=0, entities=60, questions=50), tmp_path / "world")
    shape = load_run_config(learning_run_file()).policy
    model_dir = init_model(
        tmp_path / "model", files["corpus"], vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size, layers=shape.layers,
    )  # fmt: skip
    engines = {
        b: TransformersEngine.from_pretrained(model_dir, threads=1, max_batch=b) for b in BATCHES
    }
    vocab = engines[BATCHES[0]].model.config.vocab_size
    rates: dict[int, list[float]] = {b: [] for b in BATCHES}
    for round_number in range(ROUNDS):
        order = BATCHES if round_number % 2 == 0 else tuple(reversed(BATCHES))
        for batch in order:
            started = time.perf_counter()
            tokens = asyncio.run(_decode(engines[batch], vocab, round_number))
            rates[batch].append(tokens / (time.perf_counter() - started))
    for engine in engines.values():
        asyncio.run(engine.close())
    base = statistics.median(rates[8])
    rows = [
        {"max_batch": b, "tokens_per_s": statistics.median(rates[b]), "rounds": rates[b],
         "ratio_to_8": statistics.median(rates[b]) / base}
        for b in BATCHES
    ]  # fmt: skip
    show_table(
        f"CPU engine, 1 thread, {CALLS} calls of {NEW_TOKENS} tokens (median of {ROUNDS} rounds)",
        ["max_batch", "tokens/s", "ratio to 8"],
        [(r["max_batch"], f"{r['tokens_per_s']:.0f}", f"{r['ratio_to_8']:.2f}") for r in rows],
    )
    write_results("engine-batch", {"calls": CALLS, "new_tokens": NEW_TOKENS, "rows": rows})
    assert all(r["tokens_per_s"] > 0 for r in rows)
