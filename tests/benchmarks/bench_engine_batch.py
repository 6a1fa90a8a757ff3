"""The CPU engine's throughput by batch size, and with calls joining the running batch.

1. Whether batching more calls than 8 would pay, all calls sent at once.
2. Agents in a closed loop, as a rollout producer drives the engine: each plays turns of the
   lengths an agent's turns have (a dozen tokens for a search, a few dozen, now and then its
   limit) and waits on a tool between them, so calls arrive while a batch is decoding. The
   engine's continuous batching (calls join the running batch, finished rows leave it) against
   whole batches (calls join an empty batch only), side by side in each round.

The learning run's policy shape (vocabulary, width and depth of its recipe's `[policy]`),
untrained (it rarely writes its end token, so each size decodes about the same tokens), one
torch thread as a service sharing 2 cores has, 32 calls at once with prompts of 150-450 tokens
(an agent's context after a page) and 64 new tokens each (the run's turn limit), at the run's
temperature. Each size or way is measured `ROUNDS` times, interleaved and their order
reversed every round, so that the machine's drift falls on all of them; the tables give tokens/s
and the ratio to 8, the engine's batch (`max_batch`), or to whole batches.

`.venv/bin/python -m pytest tests/benchmarks/bench_engine_batch.py -m benchmark -s` (about 6
minutes on 2 cores). Results: results/engine-batch.json, results/engine-joining.json.
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


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The learning run's policy shape, untrained."""
    tmp_path = tmp_path_factory.mktemp("engine")
    files = write_world(generate_world(seed=0, entities=60, questions=50), tmp_path / "world")
    shape = load_run_config(learning_run_file()).policy
    return init_model(
        tmp_path / "model", files["corpus"], vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size, layers=shape.layers,
    )  # fmt: skip


def test_engine_tokens_per_second_by_batch(model_dir: Path) -> None:
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


AGENTS = (8, 12)  # the learning run's concurrency, and half as many again
TRAJECTORIES = 32
TURNS = 4
TOOL_S = 0.05  # a tool call's round trip through Kafka and a tool worker


def turn_limit(rng: random.Random) -> int:
    """Tokens a turn writes: mostly a search or a page to open, sometimes more, at times up to
    the turn limit (the learning run's agent averages 25-35 tokens a turn)."""
    kind = rng.random()
    if kind < 0.6:
        return rng.randint(8, 20)
    return rng.randint(20, 40) if kind < 0.85 else NEW_TOKENS


async def _agent(engine: TransformersEngine, vocab: int, seed: int) -> int:
    """Tokens one agent wrote over its turns, its context growing by each turn's output and a
    tool's answer."""
    rng = random.Random(seed)
    context = [rng.randrange(257, vocab) for _ in range(rng.randint(40, 80))]
    written = 0
    for turn in range(TURNS):
        params = GenerateParams(temperature=0.7, max_new_tokens=turn_limit(rng), seed=seed + turn)
        out = await engine.generate(context, params)
        written += len(out.token_ids)
        await asyncio.sleep(TOOL_S)
        context += out.token_ids + [rng.randrange(257, vocab) for _ in range(rng.randint(100, 300))]
    return written


async def _closed_loop(engine: TransformersEngine, agents: int, seed: int) -> float:
    """Tokens/s of `TRAJECTORIES` agents' turns, `agents` of them playing at once."""
    vocab = engine.model.config.vocab_size
    gate = asyncio.Semaphore(agents)

    async def play(index: int) -> int:
        async with gate:
            return await _agent(engine, vocab, seed * 1000 + index * TURNS)

    started = time.perf_counter()
    written = await asyncio.gather(*(play(i) for i in range(TRAJECTORIES)))
    return sum(written) / (time.perf_counter() - started)


def test_engine_agents_joining_the_running_batch_against_whole_batches(model_dir: Path) -> None:
    ways = {
        (way, agents): TransformersEngine.from_pretrained(
            model_dir, threads=1, max_batch=8, continuous=way == "joining"
        )
        for way in ("whole", "joining")
        for agents in AGENTS
    }
    rates: dict[tuple[str, int], list[float]] = {key: [] for key in ways}
    for round_number in range(ROUNDS):
        order = list(ways) if round_number % 2 == 0 else list(reversed(ways))
        for way, agents in order:
            rate = asyncio.run(_closed_loop(ways[way, agents], agents, round_number))
            rates[way, agents].append(rate)
    for engine in ways.values():
        asyncio.run(engine.close())
    rows = []
    for way, agents in ways:
        base = statistics.median(rates["whole", agents])
        rows.append({
            "way": way, "agents": agents, "tokens_per_s": statistics.median(rates[way, agents]),
            "rounds": rates[way, agents],
            "ratio_to_whole": statistics.median(rates[way, agents]) / base,
            "largest_batch": ways[way, agents].stats.largest_batch,
        })  # fmt: skip
    show_table(
        f"CPU engine, 1 thread, max_batch 8: {TRAJECTORIES} agents' {TURNS} turns, a {TOOL_S}s "
        f"tool between turns (median of {ROUNDS} rounds)",
        ["way", "agents at once", "tokens/s", "ratio to whole batches"],
        [(r["way"], r["agents"], f"{r['tokens_per_s']:.0f}", f"{r['ratio_to_whole']:.2f}")
         for r in rows],
    )  # fmt: skip
    write_results(
        "engine-joining",
        {"trajectories": TRAJECTORIES, "turns": TURNS, "tool_s": TOOL_S, "rows": rows},
    )
    assert all(r["tokens_per_s"] > 0 for r in rows)
