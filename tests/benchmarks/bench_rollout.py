"""One rollout producer with the CPU model: throughput, what the bus costs, weight-update latency.

Model: the default `asearcher model init` policy (Qwen2, ~3.9M parameters, random weights), so
most trajectories end after one turn with a format failure; that is fine for throughput, which
is generation-bound. Every request asks for 4 trajectories of at most 128 new tokens per turn,
seeded, so the Kafka and in-process runs sample the same tokens.

Figures, per concurrency 1, 4 and 16 (the engine batches up to 8 calls):
- trajectories/s and generated tokens/s through Kafka (`RolloutService`, a real tool worker),
  from the first group's start to the last group's commit;
- the same groups played in-process (agent loop, in-process tools, no events), side by side in
  the same run: the wall-time ratio is what the bus costs end to end;
- the event loop's own time in encoding and handing events to Kafka (`bus_s`), as a share of
  the wall time, and the time spent in group transactions.
Then, with 16 trajectories in flight, three weight versions are published one after another:
the time from `WeightsPublished` to the engine having loaded it, and to the end of the first
turn generated with it (an upper bound for its first token).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from harness import show_table, write_results

from asearcher.consumers.tools.toolbox import LocalReader, LocalSearch, Toolbox, ToolConfig
from asearcher.consumers.world.world import generate_world, write_world
from asearcher.producers.agents.agent import AgentConfig, run_trajectory
from asearcher.producers.engines.hf_engine import TransformersEngine
from asearcher.producers.policy.model_init import init_model
from asearcher.producers.rollout.service import RolloutConfig, RolloutService
from asearcher.producers.rollout.staleness import StalenessConfig
from asearcher.producers.rollout.tool_router import InProcessToolClient
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import GenerationStep, WeightsPublished
from asearcher.trainer.runtime.weight_publisher import WeightStore
from tests.support.rollout import (
    FAST_GROUP,
    ToolWorkerThread,
    events_of,
    fresh_topics,
    send_requests,
)

pytestmark = pytest.mark.benchmark

CONCURRENCY = (1, 4, 16)
GROUPS = 8
GROUP_SIZE = 4
MAX_NEW_TOKENS = 128
ROUNDS = 2
WEIGHT_UPDATES = 3


class NoSteps:
    def emit(self, event: GenerationStep) -> None:
        return None


def questions(world, count: int) -> list:
    return world.questions[:count]


def kafka_run(settings, codec, engine, make_topic, world, index, tmp: Path, concurrency: int):
    topics = fresh_topics(make_topic)
    send_requests(settings, codec, topics.requests, questions(world, GROUPS), GROUP_SIZE,
                  max_new_tokens_per_turn=MAX_NEW_TOKENS, seed=11)  # fmt: skip
    config = RolloutConfig(
        topics=topics, group_id=f"bench-{uuid.uuid4().hex[:6]}", concurrency=concurrency,
        staleness=StalenessConfig(enabled=False),
    )  # fmt: skip
    service = RolloutService(settings, codec, engine, config, **FAST_GROUP)
    with ToolWorkerThread(settings, codec, topics, index, (tmp / uuid.uuid4().hex).as_uri()):
        stats = service.run(max_groups=GROUPS, timeout=600)
    service.close()
    wall = stats.last_commit_at - stats.first_group_at
    return {
        "wall_s": wall,
        "trajectories": stats.trajectories,
        "tokens": stats.generated_tokens,
        "bus_s": stats.bus_s + service.tools.send_s,
        "commit_s": stats.commit_s,
    }


def local_run(settings, codec, engine, world, toolbox, concurrency: int) -> dict[str, Any]:
    from asearcher.streams.wire.events import RolloutRequested, SamplingSettings

    requests = [
        RolloutRequested(question_id=q.id, group_id=q.id, question=q.question,
                         gold_answers=q.answers, group_size=GROUP_SIZE,
                         sampling=SamplingSettings(max_new_tokens_per_turn=MAX_NEW_TOKENS, seed=11))
        for q in questions(world, GROUPS)
    ]  # fmt: skip
    tools = InProcessToolClient(toolbox)

    async def play() -> list:
        slots = asyncio.Semaphore(concurrency)

        async def one(request, index):
            async with slots:
                return await run_trajectory(request, index, engine, tools, NoSteps(), AgentConfig())

        jobs = [one(r, i) for r in requests for i in range(GROUP_SIZE)]
        return await asyncio.gather(*jobs)

    started = time.monotonic()
    finished = asyncio.run(play())
    wall = time.monotonic() - started
    tokens = sum(sum(t.loss_mask) for t in finished)
    return {"wall_s": wall, "trajectories": len(finished), "tokens": tokens}


def perturbed(engine: TransformersEngine, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + 0.01 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in engine.model.state_dict().items()
        if name != "lm_head.weight"
    }


def weight_latency(settings, codec, engine, make_topic, world, tmp: Path) -> list[dict]:
    topics = fresh_topics(make_topic)
    send_requests(settings, codec, topics.requests, questions(world, 40), GROUP_SIZE,
                  max_new_tokens_per_turn=MAX_NEW_TOKENS, seed=5)  # fmt: skip
    config = RolloutConfig(topics=topics, group_id=f"bench-w-{uuid.uuid4().hex[:6]}",
                           concurrency=16, staleness=StalenessConfig(enabled=False))  # fmt: skip
    service = RolloutService(settings, codec, engine, config, **FAST_GROUP)
    thread = threading.Thread(target=service.run, kwargs={"timeout": 300}, daemon=True)
    thread.start()
    store, published = WeightStore((tmp / "weights").as_uri()), []
    base = engine.version
    with EventProducer(settings, codec) as producer:
        while service.stats.turns < 16:
            time.sleep(0.1)
        for step in range(1, WEIGHT_UPDATES + 1):
            version = base + step
            out = store.publish_state_dict(version, step, version - 1, perturbed(engine, step))
            event = WeightsPublished(version=version, uri=out.uri, sha256=out.sha256, step=step)
            producer.send(topics.weights, event)
            producer.flush()
            published.append(event)
            while engine.version < version:
                time.sleep(0.01)
            time.sleep(3)
    service.stop()
    thread.join(300)
    service.close()
    steps = [e for e in events_of(settings, codec, topics.steps) if isinstance(e, GenerationStep)]
    rows = []
    for event in published:
        loaded_at = service.weights.loaded_at[event.version]
        with_it = [s for s in steps if s.policy_version == event.version]
        # A turn queued before the load may run after it, so its start says nothing: the first
        # turn to *finish* with the version bounds when its first token was generated.
        first_turn = min(s.created_at for s in with_it)
        rows.append({
            "version": event.version,
            "to_loaded_s": loaded_at - event.created_at,
            "to_first_new_turn_done_s": first_turn - event.created_at,
        })  # fmt: skip
    return rows


def test_rollout_producer_throughput_bus_share_and_weight_latency(
    settings, make_topic, tmp_path: Path
) -> None:
    codec = EventCodec()
    world = generate_world(seed=3, entities=300, questions=200)
    files = write_world(world, tmp_path / "world")
    from asearcher.consumers.tools.local_index import LocalIndex, build_index

    build_index(files["corpus"], tmp_path / "index", dense=False)
    index = LocalIndex(tmp_path / "index")
    toolbox = Toolbox(LocalSearch(index, "bm25"), LocalReader(index), ToolConfig())
    model_dir = init_model(tmp_path / "model", files["corpus"])
    engine = TransformersEngine.from_pretrained(model_dir)

    runs: dict[int, dict[str, list]] = {c: {"kafka": [], "local": []} for c in CONCURRENCY}
    for round_number in range(ROUNDS):
        order = CONCURRENCY if round_number % 2 == 0 else tuple(reversed(CONCURRENCY))
        for concurrency in order:
            runs[concurrency]["kafka"].append(
                kafka_run(
                    settings,
                    codec,
                    engine,
                    make_topic,
                    world,
                    index.directory,
                    tmp_path,
                    concurrency,
                )  # fmt: skip
            )
            runs[concurrency]["local"].append(
                local_run(settings, codec, engine, world, toolbox, concurrency)
            )
    rows, results = [], {"concurrency": {}}
    for concurrency, both in runs.items():
        kafka, local = _total(both["kafka"]), _total(both["local"])
        summary = {
            "trajectories_per_s": kafka["trajectories"] / kafka["wall_s"],
            "tokens_per_s": kafka["tokens"] / kafka["wall_s"],
            "local_tokens_per_s": local["tokens"] / local["wall_s"],
            "bus_share": kafka["bus_s"] / kafka["wall_s"],
            "commit_s_per_group": kafka["commit_s"] / (GROUPS * ROUNDS),
            "runs": both,
        }
        summary["end_to_end_overhead"] = 1 - summary["tokens_per_s"] / summary["local_tokens_per_s"]
        results["concurrency"][concurrency] = summary
        rows.append((
            concurrency, f"{summary['trajectories_per_s']:.2f}", f"{summary['tokens_per_s']:.0f}",
            f"{summary['local_tokens_per_s']:.0f}", f"{summary['end_to_end_overhead']:+.1%}",
            f"{summary['bus_share']:.2%}", f"{summary['commit_s_per_group'] * 1000:.1f}",
        ))  # fmt: skip
    show_table(
        "one rollout producer, CPU model (Kafka vs in-process, same groups, same run)",
        ["concurrency", "traj/s", "tokens/s", "in-process tokens/s", "bus overhead (wall)",
         "bus share (loop time)", "commit ms/group"],
        rows,
    )  # fmt: skip
    latency = weight_latency(settings, codec, engine, make_topic, world, tmp_path)
    show_table(
        "WeightsPublished -> new version in use (16 trajectories in flight)",
        ["version", "to loaded (s)", "to first turn with it done (s)"],
        [(r["version"], f"{r['to_loaded_s']:.3f}", f"{r['to_first_new_turn_done_s']:.3f}")
         for r in latency],
    )  # fmt: skip
    results["weight_updates"] = latency
    results["model_parameters"] = sum(p.numel() for p in engine.model.parameters())
    write_results("rollout", results)
    asyncio.run(engine.close())


def _total(runs: list[dict]) -> dict[str, float]:
    keys = runs[0].keys()
    return {key: sum(run[key] for run in runs) for key in keys}
