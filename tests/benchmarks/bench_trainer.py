"""The trainer on CPU: tokens/s per ZeRO stage, weight publish/load cost, idle fraction when fed.

1. Tokens/s: the default CPU policy (`model init`, ~3.9M parameters), batches of 8 groups of 4
   trajectories of 320 tokens (a 64-token prompt, 256 policy tokens), micro-batches of 4096
   tokens; per ZeRO stage 0-3 one warm-up step, then STEPS measured steps, in two rounds (the
   second in reverse order).
2. Weights: publishing (safetensors + checksums + manifest) and loading (verify + parse) state
   dicts of 16, 64 and 256 MB through `file://` and `s3://` (a local moto server), against a
   plain copy of the same bytes (file copy; S3 put + get), ratios from the same run.
3. Idle fraction: one rollout producer with the CPU model (16 trajectories at once, 64 new
   tokens per turn) feeding the trainer (2 groups of 4 per step) on the same two cores. The
   untrained model's rewards are all 0 (flat groups carry no signal and are dropped), so every
   other generated turn is swapped for the right answer after it was generated.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from harness import show_table, write_results

from asearcher.streams.storage.weight_reader import load_state_dict
from asearcher.streams.wire.codec import EventCodec
from asearcher.trainer.policy.batching import BatchingConfig, Group
from asearcher.trainer.policy.objective import ObjectiveConfig
from asearcher.trainer.policy.step import train_on_batch
from asearcher.trainer.runtime.deepspeed_setup import deepspeed_config, initialize
from asearcher.trainer.runtime.weight_publisher import WeightStore
from tests.support.trainer import completion

pytestmark = pytest.mark.benchmark

STAGES = (0, 1, 2, 3)
STEPS = 3
GROUPS, GROUP_SIZE, PROMPT, TAIL = 8, 4, 64, 256
SIZES_MB = (16, 64, 256)


def batch(vocab: int, seed: int) -> list[Group]:
    generator = torch.Generator().manual_seed(seed)
    groups = []
    for number in range(GROUPS):
        prompt = torch.randint(1, vocab, (PROMPT,), generator=generator).tolist()
        members = []
        for index in range(GROUP_SIZE):
            tail = torch.randint(1, vocab, (TAIL,), generator=generator).tolist()
            members.append(completion(prompt, tail, float(index % 2), f"g{number}", GROUP_SIZE))
        groups.append(Group(group_id=f"g{number}", trajectories=members))
    return groups


def zero_stage_throughput(model_dir: Path) -> list[dict[str, Any]]:
    """Two rounds, the second in reverse order, so no stage always runs first."""
    from transformers import AutoModelForCausalLM

    seconds = {stage: 0.0 for stage in STAGES}
    tokens = {stage: 0 for stage in STAGES}
    for order in (STAGES, tuple(reversed(STAGES))):
        for stage in order:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            engine = initialize(model, deepspeed_config({"zero_optimization": {"stage": stage}}))
            work = batch(model.config.vocab_size, seed=stage)
            train_on_batch(engine, work, ObjectiveConfig(), 4096)  # warm-up
            for _ in range(STEPS):
                result = train_on_batch(engine, work, ObjectiveConfig(), 4096)
                seconds[stage] += result.stats.seconds
                tokens[stage] += result.stats.tokens
            engine.destroy()
    return [
        {"stage": s, "tokens_per_s": tokens[s] / seconds[s], "step_s": seconds[s] / (2 * STEPS)}
        for s in STAGES
    ]


def state_of_size(megabytes: int) -> dict[str, torch.Tensor]:
    floats = megabytes * 1024 * 1024 // 4
    rows = floats // 1024
    return {f"layer.{i}.weight": torch.randn(rows // 8, 1024) for i in range(8)}


def weight_costs(tmp: Path, s3_url: str, s3_options: dict[str, Any]) -> list[dict[str, Any]]:
    import fsspec

    rows = []
    for megabytes in SIZES_MB:
        state = state_of_size(megabytes)
        for backend, root, options in (
            ("file", (tmp / f"store-{megabytes}").as_uri(), {}),
            ("s3", f"{s3_url}/store-{megabytes}", s3_options),
        ):
            store = WeightStore(root, options)
            started = time.perf_counter()
            published = store.publish_state_dict(1, 1, 0, state)
            publish_s = time.perf_counter() - started
            started = time.perf_counter()
            load_state_dict(published.uri, published.sha256, options)
            load_s = time.perf_counter() - started
            payload = store.read_file(1, "model.safetensors")
            copy_s = plain_copy(fsspec, backend, tmp, root, options, payload)
            rows.append({"size_mb": megabytes, "backend": backend, "publish_s": publish_s,
                         "load_s": load_s, "plain_copy_s": copy_s})  # fmt: skip
    return rows


def plain_copy(fsspec, backend: str, tmp: Path, root: str, options, payload: bytes) -> float:
    """Write then read the same bytes without the store: the floor it is compared with."""
    started = time.perf_counter()
    if backend == "file":
        source = tmp / "plain.bin"
        source.write_bytes(payload)
        shutil.copyfile(source, tmp / "plain-copy.bin")
        (tmp / "plain-copy.bin").read_bytes()
    else:
        fs, path = fsspec.core.url_to_fs(f"{root}/plain.bin", **options)
        fs.pipe_file(path, payload)
        fs.cat_file(path)
    return time.perf_counter() - started


class HalfRightEngine:
    """The CPU model generates every turn (the real cost); every other call's text is then
    replaced by the right answer, so groups have rewards to learn from (an untrained model's
    are all 0, and flat groups are dropped)."""

    def __init__(self, engine, questions) -> None:
        self.engine, self.calls = engine, 0
        self.golds = {q.question: q.answers[0] for q in questions}

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    @property
    def version(self) -> int:
        return self.engine.version

    async def generate(self, prompt_ids, params):
        import msgspec

        result = await self.engine.generate(prompt_ids, params)
        self.calls += 1
        if self.calls % 2:
            return result
        prompt = self.engine.tokenizer.decode(prompt_ids)
        gold = next((a for q, a in self.golds.items() if q in prompt), "unknown")
        ids = self.engine.tokenizer.encode(f"<think>sure</think><answer>{gold}</answer>")
        return msgspec.structs.replace(
            result, token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="stop"
        )


def idle_fraction(settings, codec, make_topic, model_dir: Path, world, tmp: Path) -> dict:
    from asearcher.producers.engines.hf_engine import TransformersEngine
    from asearcher.producers.rollout.service import RolloutConfig, RolloutService
    from asearcher.producers.rollout.staleness import StalenessConfig
    from asearcher.trainer.runtime.config import TrainerConfig, TrainerTopics
    from asearcher.trainer.runtime.service import TrainerService
    from tests.support.rollout import FAST_GROUP, fresh_topics, send_requests

    topics = fresh_topics(make_topic)
    send_requests(settings, codec, topics.requests, world.questions[:24], GROUP_SIZE,
                  max_new_tokens_per_turn=64, seed=3)  # fmt: skip
    engine = HalfRightEngine(TransformersEngine.from_pretrained(model_dir), world.questions)
    rollout = RolloutService(
        settings, codec, engine,
        RolloutConfig(topics=topics, group_id=f"b-{uuid.uuid4().hex[:6]}", concurrency=16,
                      staleness=StalenessConfig(eta=4, batch_groups=2)),
        **FAST_GROUP,
    )  # fmt: skip
    producer = threading.Thread(target=rollout.run, kwargs={"timeout": 600}, daemon=True)
    trainer_topics = TrainerTopics(trajectories=topics.trajectories, weights=topics.weights,
                                   metrics=make_topic(like="trainer.metrics"))  # fmt: skip
    config = TrainerConfig(
        topics=trainer_topics, group_id=f"t-{uuid.uuid4().hex[:6]}", instance=uuid.uuid4().hex,
        batching=BatchingConfig(groups_per_batch=2, min_group_size=2),
    )  # fmt: skip
    store = WeightStore((tmp / "idle-weights").as_uri())
    trainer = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    producer.start()
    steps = trainer.run(max_steps=6, timeout=600)
    rollout.stop()
    producer.join(120)
    rollout.close()
    trainer.close()
    measured = trainer.steps[1:]  # the first step also waited for the producer to start
    return {
        "steps": steps,
        "idle_fraction": sum(s.idle_fraction for s in measured) / max(1, len(measured)),
        "dropped_flat_groups": sum(s.dropped_flat_groups for s in trainer.steps),
        "step_s": sum(s.stats.seconds for s in measured) / max(1, len(measured)),
        "producer_tokens_per_s": rollout.stats.generated_tokens
        / max(1e-9, time.monotonic() - rollout.stats.started_at),
    }


def test_trainer_throughput_weight_costs_and_idle_fraction(
    settings, make_topic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from moto.server import ThreadedMotoServer

    from asearcher.consumers.world.world import generate_world, write_world
    from asearcher.producers.policy.model_init import init_model, parameter_count
    from tests.conftest import free_port_pair

    world = generate_world(seed=5, entities=300, questions=100)
    files = write_world(world, tmp_path / "world")
    model_dir = init_model(tmp_path / "model", files["corpus"])
    zero = zero_stage_throughput(model_dir)
    show_table(
        f"trainer on CPU, {parameter_count(model_dir):,}-parameter policy, "
        f"{GROUPS * GROUP_SIZE} x {PROMPT + TAIL} tokens per step",
        ["ZeRO stage", "tokens/s", "s/step", "vs stage 0"],
        [(r["stage"], f"{r['tokens_per_s']:.0f}", f"{r['step_s']:.2f}",
          f"{r['tokens_per_s'] / zero[0]['tokens_per_s']:.2f}x") for r in zero],
    )  # fmt: skip

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    port = free_port_pair()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        options = {"client_kwargs": {"endpoint_url": endpoint}}
        costs = weight_costs(tmp_path, "s3://bench", options)
    finally:
        server.stop()
    show_table(
        "weight publish and load vs a plain copy of the same bytes",
        ["size MB", "store", "publish s", "load s", "plain copy s", "(publish+load)/copy"],
        [(r["size_mb"], r["backend"], f"{r['publish_s']:.3f}", f"{r['load_s']:.3f}",
          f"{r['plain_copy_s']:.3f}", f"{(r['publish_s'] + r['load_s']) / r['plain_copy_s']:.2f}")
         for r in costs],
    )  # fmt: skip

    idle = idle_fraction(settings, EventCodec(), make_topic, model_dir, world, tmp_path)
    show_table(
        "trainer fed by one rollout producer (CPU model), same two cores",
        ["steps", "idle fraction", "s/step", "flat groups dropped", "producer tokens/s"],
        [(idle["steps"], f"{idle['idle_fraction']:.1%}", f"{idle['step_s']:.2f}",
          idle["dropped_flat_groups"], f"{idle['producer_tokens_per_s']:.0f}")],
    )  # fmt: skip
    write_results("trainer", {"zero_stages": zero, "weights": costs, "idle": idle})
