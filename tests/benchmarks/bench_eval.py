"""The evaluation pipeline: how fast a benchmark is scored, and what the processor costs.

1. Throughput. The synthetic world's held-out questions (16 of them) are evaluated at k=1 and
   k=4 the way `asearcher eval run` does it: evaluation requests on `eval.requests` pinned to
   version 0, an evaluator (`RolloutService` in eval mode, configured like `eval serve`, warm, in
   a thread), a real BM25 tool worker on `tool.calls`, and the faust evaluation processor
   (`asearcher eval process`, a child process) on `eval.trajectories`. Two engines:
   - expert, the scripted oracle (16 turns, 128 tokens per call, the CLI's defaults): the model
     costs nothing, so this measures the pipeline (Kafka, tools, evaluator, processor);
   - transformers, the CPU policy of `asearcher model init` (random weights, 4 turns of at
     most 32 tokens, so it finishes), with torch limited to one intra-op thread: on 2 shared
     cores the default (one thread per core) spins against the processor, the broker and any
     other test run and is several times slower; the same seeded generate calls are timed
     in-process with both settings first, and both times are recorded.
   The clock runs from the first request sent to the `EvalResult` read back (read_committed);
   "play" ends when the last trajectory is read back, "score" is the rest (the processor's
   latency, transaction commit included). A warm-up evaluation per engine is not counted; the
   expert's evaluations take seconds, so it runs 3 rounds (rates over all of them, seconds per
   round).

2. The processor's overhead per trajectory. N crafted evaluation trajectories (256 tokens
   each, reward_parts f1/em/cem/format, metadata eval_id/benchmark/questions, keyed like
   `eval.trajectories`) are written to a private topic first. Then, side by side in the same run
   on the same records:
   (a) the faust processor is started on the topic, timed from its start to its `EvalResult`s
       read back; its output lines are timestamped as they arrive, so the time from the
       worker's "Ready" to its last result line is its processing time;
   (b) a plain confluent-kafka consumer + `EventCodec.decode` reads the same records;
   (c) the processor's state logic without faust or Kafka (decode, `sample_of`,
       `count_sample` on two dicts of JSON text as the processor's tables), which also counts
       the bytes the processor writes to its changelogs.
   Layouts: 1 trajectory (the start-up, subtracted), one evaluation of 125 and of 500 questions
   x 4 samples, and 500 questions x 4 spread over 100 evaluations of 5 questions. The extra per
   trajectory is (a) minus (b); (a) per trajectory is given both as processing time / N and as
   (run time - 1-trajectory run time) / (N - 1). The processor keeps running sums per
   evaluation and the samples of open questions per question; the largest table value written
   is recorded for the 125- and 500-question evaluations (it must not grow with the size).

The faust child runs with BROKER_SESSION_TIMEOUT=10 and BROKER_HEARTBEAT_INTERVAL=1 to keep its
group joins short; it is stopped with SIGTERM and its exit status is recorded. The load average
at the start and end is recorded: another test run may share the machine's cores, which slows
everything here alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from confluent_kafka import Consumer, TopicPartition
from harness import clock, show_table, write_results

from asearcher.cli.eval import evaluator_config
from asearcher.consumers.evaluation.benchmarks import (
    BenchmarkQuestion,
    eval_requests,
    read_world_benchmark,
)
from asearcher.consumers.evaluation.eval_gathering import count_sample
from asearcher.consumers.evaluation.eval_scores import sample_of
from asearcher.consumers.tools.local_index import build_index
from asearcher.consumers.world.world import generate_world, write_world
from asearcher.producers.engines.base import GenerateParams, InferenceEngine
from asearcher.producers.engines.registry import make_engine
from asearcher.producers.policy.model_init import init_model
from asearcher.producers.rollout.service import RolloutService, RolloutTopics
from asearcher.streams.cluster.admin import ensure_topics
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    EvalResult,
    SamplingSettings,
    TrajectoryFinished,
    new_id,
)
from asearcher.streams.wire.topics import EVAL_REQUESTS, EVAL_RESULTS, EVAL_TRAJECTORIES, topic_spec
from tests.support.rollout import FAST_GROUP, ToolWorkerThread

pytestmark = pytest.mark.benchmark

QUESTIONS = 16
SAMPLES = (1, 4)
ENGINES = {
    # engine: (max_turns, max_new_tokens_per_turn, rounds): the expert's seconds are noisy
    "expert": (16, 128, 3),
    "transformers": (4, 32, 1),
}
TOKENS = 256  # per crafted trajectory
LAYOUTS = {
    # name: (evaluations, questions per evaluation), 4 samples each, except the start-up run
    "1 trajectory (start-up)": (1, 1),
    "1 eval x 125 q x 4": (1, 125),
    "1 eval x 500 q x 4": (1, 500),
    "100 evals x 5 q x 4": (100, 5),
}
K_CRAFTED = 4
READY = "[^Worker]: Ready"


# ---------------------------------------------------------------- the processor as a child


class ProcessorChild:
    """`asearcher eval process` in a child process, each output line timestamped on arrival."""

    def __init__(self, broker, home: Path, **config: str) -> None:
        self.app_id = config.setdefault("app_id", f"bench-eval-{uuid.uuid4().hex[:8]}")
        file = home / f"{self.app_id}.toml"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in config.items()))
        env = {**os.environ, "BROKER_SESSION_TIMEOUT": "10", "BROKER_HEARTBEAT_INTERVAL": "1",
               "PYTHONUNBUFFERED": "1"}  # fmt: skip
        command = [sys.executable, "-m", "asearcher.cli.app", "eval", "process", "-c",
                   str(file), "--bootstrap-servers", broker.bootstrap_servers,
                   "--home", str(home)]  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.started = clock()
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((clock(), line.rstrip()))

    def first(self, needle: str) -> float | None:
        """When the first line holding `needle` arrived (None: not yet)."""
        return next((at for at, line in list(self.lines) if needle in line), None)

    def wait_for(self, needle: str, timeout: float = 120.0) -> float:
        deadline = clock() + timeout
        while (at := self.first(needle)) is None:
            if self.process.poll() is not None or clock() > deadline:
                raise RuntimeError(f"processor never said {needle!r}:\n{self.tail()}")
            threading.Event().wait(0.05)
        return at

    def tail(self, count: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-count:])

    def close(self) -> None:
        """Stop the worker; record how it ended (a faust worker may hang on its way out)."""
        self.process.terminate()
        try:
            self.exit: int | str = self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            self.exit = "killed: still running 30 s after SIGTERM"
        if self.exit != 0:
            print(f"processor {self.app_id} exit: {self.exit}; its last lines:\n{self.tail(12)}")
        self.reader.join(10)

    def __enter__(self) -> ProcessorChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Follower:
    """Reads topics from their current ends, or from the start (a topic just made, whose
    leaders may not be known yet), read_committed, decoding what arrives."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        topics: list[str],
        from_start: bool = False,
    ) -> None:
        self.codec = codec
        self.consumer = Consumer(settings.client(**{
            "group.id": f"bench-follow-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }))  # fmt: skip
        positions = []
        for topic in topics:
            metadata = self.consumer.list_topics(topic, timeout=30).topics[topic]
            for partition in metadata.partitions:
                end = 0
                if not from_start:
                    _, end = self.consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=30
                    )
                positions.append(TopicPartition(topic, partition, end))
        self.consumer.assign(positions)

    def poll(self, timeout: float = 0.2) -> list[tuple[float, Any]]:
        """The events that arrived, each with when it was read (one by one: a batch would give
        them all the time of its last)."""
        arrived = []
        message = self.consumer.poll(timeout)
        while message is not None:
            if message.error() is None:
                kinds = (TrajectoryFinished, EvalResult)
                event = self.codec.decode(message.value(), message.headers(), kinds)
                arrived.append((clock(), event))
            message = self.consumer.poll(0)
        return arrived

    def close(self) -> None:
        self.consumer.close()


# ---------------------------------------------------------------- 1. throughput


def sampling_for(engine: str) -> SamplingSettings:
    """The eval CLI's sampling (temperature 0.6, top-p 0.95), seeded, with the engine's limits."""
    max_turns, max_new_tokens, _ = ENGINES[engine]
    return SamplingSettings(temperature=0.6, top_p=0.95, max_turns=max_turns,
                            max_new_tokens_per_turn=max_new_tokens, seed=7)  # fmt: skip


def evaluate(
    settings, codec, evaluator: str, questions: list[BenchmarkQuestion], k: int, engine: str
) -> dict[str, Any]:
    """One evaluation through the pipeline; times from the first request to its EvalResult."""
    sampling = sampling_for(engine)
    eval_id = f"bench-{engine}-k{k}-{uuid.uuid4().hex[:6]}"
    requests = eval_requests(questions, eval_id=eval_id, benchmark="world", k=k,
                             policy_version=0, sampling=sampling, evaluator=evaluator)  # fmt: skip
    follower = Follower(settings, codec, [EVAL_TRAJECTORIES, EVAL_RESULTS])
    try:
        started = clock()
        with EventProducer(settings, codec) as producer:
            for request in requests:
                producer.send(EVAL_REQUESTS, request)
            producer.flush()
        run = _follow(follower, eval_id, started, len(questions), k)
    finally:
        follower.close()
    print(f"{engine} k={k}: {len(questions)} questions in {run['wall_s']:.2f}s", flush=True)
    return run


def _follow(follower: Follower, eval_id: str, started: float, questions: int, k: int) -> dict:
    deadline, last_trajectory, trajectories = started + 300, started, set()
    while clock() < deadline:
        for at, event in follower.poll():
            if isinstance(event, TrajectoryFinished) and event.metadata.get("eval_id") == eval_id:
                trajectories.add(event.trajectory_id)
                last_trajectory = at
            elif isinstance(event, EvalResult) and event.eval_id == eval_id:
                assert len(trajectories) == questions * k, (len(trajectories), questions * k)
                assert (event.questions, event.samples_per_question) == (questions, k)
                return {
                    "wall_s": at - started, "play_s": last_trajectory - started,
                    "score_s": at - last_trajectory, "questions": questions,
                    "trajectories": len(trajectories), "f1": event.averages["f1"],
                    "turns": event.averages["turns"], "gen_len": event.averages["gen_len"],
                }  # fmt: skip
    raise TimeoutError(f"no EvalResult for {eval_id}: {len(trajectories)} trajectories in")


def engine_runs(settings, codec, engine: InferenceEngine, name: str, store: str, questions):
    """Warm up an evaluator of `engine`, then its rounds of one evaluation per k."""
    config = evaluator_config(None, group_id=f"bench-evaluators-{uuid.uuid4().hex[:6]}",
                              store=store)  # fmt: skip
    service = RolloutService(settings, codec, engine, config, **FAST_GROUP)
    thread = threading.Thread(target=service.run, kwargs={"timeout": 900}, daemon=True)
    thread.start()
    try:
        evaluate(settings, codec, config.group_id, questions[:2], 1, name)  # warm-up
        rounds = ENGINES[name][2]
        return {
            k: [
                evaluate(settings, codec, config.group_id, questions, k, name)
                for _ in range(rounds)
            ]
            for k in SAMPLES
        }
    finally:
        service.stop()
        thread.join(120)
        service.close()


def throughput(broker, settings, codec, tmp: Path) -> dict[str, Any]:
    world = generate_world(seed=3, entities=300, questions=200)
    files = write_world(world, tmp / "world")
    build_index(files["corpus"], tmp / "index", dense=False)
    model_dir = init_model(tmp / "model", files["corpus"])
    questions = read_world_benchmark(tmp / "world")[:QUESTIONS]
    assert len(questions) == QUESTIONS
    default_threads = torch.get_num_threads()
    threads = thread_check(model_dir, default_threads)
    store = (tmp / "weights").as_uri()
    runs: dict[str, Any] = {}
    torch.set_num_threads(1)  # see thread_check; before the engine's worker thread starts
    try:
        engines = {
            "expert": make_engine("expert", model_dir, qa_file=files["qa_test"]),
            "transformers": make_engine("transformers", model_dir),
        }
        with (
            ProcessorChild(broker, tmp / "home") as processor,
            ToolWorkerThread(settings, codec, RolloutTopics(), tmp / "index",
                             (tmp / "results").as_uri()),
        ):  # fmt: skip
            processor.wait_for(READY)
            for name, engine in engines.items():
                runs[name] = engine_runs(settings, codec, engine, name, store, questions)
    finally:
        torch.set_num_threads(default_threads)
    parameters = sum(p.numel() for p in engines["transformers"].model.parameters())
    for engine in engines.values():
        asyncio.run(engine.close())
    return {"runs": runs, "transformers_parameters": parameters, "torch_threads": threads,
            "processor_exit": processor.exit}  # fmt: skip


def thread_check(model_dir: Path, default: int) -> dict[str, float]:
    """Seconds for the same seeded generate calls with torch's default intra-op threads and
    with one, in the order default, 1, 1, default (drift in the machine's load cancels).

    torch fixes an OS thread's OpenMP pool when that thread first computes, so each setting
    gets a fresh engine (whose worker thread starts after the setting)."""
    params = GenerateParams(temperature=0.6, top_p=0.95, max_new_tokens=64, seed=1)
    prompt = list(range(5, 405))  # about an evaluation prompt's length
    timings = {f"{default}_threads_s": 0.0, "1_threads_s": 0.0}
    for count in (default, 1, 1, default):
        torch.set_num_threads(count)
        engine = make_engine("transformers", model_dir)

        async def calls(engine: InferenceEngine = engine) -> float:
            await engine.generate(prompt[:8], GenerateParams(max_new_tokens=2))  # warm-up
            started = clock()
            for _ in range(3):
                await engine.generate(prompt, params)
            elapsed = clock() - started
            await engine.close()
            return elapsed

        timings[f"{count}_threads_s"] += asyncio.run(calls())
    torch.set_num_threads(default)
    return timings


# ---------------------------------------------------------------- 2. processor overhead


def crafted(evaluations: int, per_evaluation: int, k: int, run: str) -> list[TrajectoryFinished]:
    """`evaluations` x `per_evaluation` questions x k samples of finished eval trajectories."""
    prompt, generated = TOKENS - 56, 56
    made = []
    for number in range(evaluations):
        metadata = {"eval_id": f"{run}-e{number}", "benchmark": "world",
                    "questions": str(per_evaluation), "evaluator": ""}  # fmt: skip
        for question in range(per_evaluation):
            for sample in range(k):
                made.append(TrajectoryFinished(
                    trajectory_id=new_id(), group_id=f"{run}-e{number}/world/q{question}",
                    question_id=f"q{question}", purpose="eval",
                    token_ids=list(range(TOKENS)), logprobs=[-0.5] * TOKENS,
                    loss_mask=[0] * prompt + [1] * generated,
                    token_versions=[-1] * prompt + [0] * generated, prompt_length=prompt,
                    reward=float(sample == 0), num_turns=3, finish_reason="answer",
                    reward_parts={"f1": float(sample == 0), "em": float(sample == 0),
                                  "cem": float(sample == 0), "format": 1.0},
                    group_size=k, sample_index=sample, temperature=0.6,
                    tool_calls={"search": 1, "browse": 1}, metadata=dict(metadata),
                    transcript=["<search>q</search>", "<information>doc</information>"],
                ))  # fmt: skip
    return made


def write_topic(settings: KafkaSettings, codec: EventCodec, events: list) -> str:
    """A private topic laid out like eval.trajectories holding `events`, keyed like it."""
    spec = topic_spec(EVAL_TRAJECTORIES).with_name(f"bench-evaltraj-{uuid.uuid4().hex[:8]}")
    ensure_topics(settings, [spec])
    with EventProducer(settings, codec) as producer:
        for event in events:
            producer.send(spec.name, event, key=event.eval_key)
        producer.flush()
    return spec.name


def plain_read(settings: KafkaSettings, codec: EventCodec, topic: str, count: int) -> dict:
    """(b): a confluent-kafka consumer decoding every record of `topic`."""
    started = clock()
    consumer = Consumer(settings.client(**{
        "group.id": f"bench-plain-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "auto.offset.reset": "earliest",
    }))  # fmt: skip
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    decoded, first = 0, None
    try:
        while decoded < count:
            for message in consumer.consume(500, 1.0):
                if message.error() is None:
                    codec.decode(message.value(), message.headers(), (TrajectoryFinished,))
                    first = clock() if first is None else first
                    decoded += 1
            if clock() - started > 120:
                raise TimeoutError(f"plain consumer read {decoded} of {count}")
    finally:
        consumer.close()
    ended = clock()
    return {"wall_s": ended - started, "after_first_s": ended - first}


class _Recorded(dict):
    """A table as a dict that counts the bytes written to it (its changelog's values)."""

    def __init__(self) -> None:
        super().__init__()
        self.written, self.largest = 0, 0

    def __setitem__(self, key: str, value: str) -> None:
        self.written += len(value)
        self.largest = max(self.largest, len(value))
        super().__setitem__(key, value)


def state_logic(codec: EventCodec, events: list[TrajectoryFinished]) -> dict:
    """(c): what the processor does per trajectory, minus faust and Kafka; counts the bytes it
    writes to its tables' changelogs."""
    records = [codec.encode(event) for event in events]
    tallies, questions = _Recorded(), _Recorded()
    results = 0
    started = clock()
    for payload, headers in records:
        trajectory = codec.decode(payload, headers, (TrajectoryFinished,))
        assert isinstance(trajectory, TrajectoryFinished)
        results += count_sample(tallies, questions, trajectory, sample_of(trajectory)) is not None
    return {"wall_s": clock() - started, "changelog_bytes": tallies.written + questions.written,
            "largest_value_bytes": max(tallies.largest, questions.largest),
            "results": results}  # fmt: skip


def processor_read(broker, settings, codec, home: Path, topic: str, expected: set[str]) -> dict:
    """(a): the faust processor started on `topic`, timed until every expected EvalResult."""
    results = topic_spec(EVAL_RESULTS).with_name(f"bench-evalres-{uuid.uuid4().hex[:8]}")
    ensure_topics(settings, [results])
    follower = Follower(settings, codec, [results.name], from_start=True)
    seen: dict[str, float] = {}
    try:
        with ProcessorChild(broker, home, trajectories_topic=topic,
                            results_topic=results.name) as processor:  # fmt: skip
            deadline = processor.started + 300
            while set(seen) < expected:
                for at, event in follower.poll():
                    if isinstance(event, EvalResult) and event.eval_id in expected:
                        seen.setdefault(event.eval_id, at)
                if clock() > deadline or processor.process.poll() is not None:
                    raise TimeoutError(f"{len(seen)} of {len(expected)} results:\n"
                                       f"{processor.tail()}")  # fmt: skip
            ready = processor.wait_for(READY, 1)
            # Its changelog writes may still be draining: SIGTERM then crashes the worker
            # (exit 1); one commit interval later it stops cleanly.
            threading.Event().wait(3)
            last_line = max(processor.wait_for(f"EvalResult {eval_id} ", 5) for eval_id in seen)
            started = processor.started
    finally:
        follower.close()
    return {
        "wall_s": max(seen.values()) - started, "startup_s": ready - started,
        "processing_s": last_line - ready, "commit_s": max(seen.values()) - last_line,
        "exit": processor.exit,
    }  # fmt: skip


def overhead(broker, settings, codec, tmp: Path) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for layout, (evaluations, per_evaluation) in LAYOUTS.items():
        k = 1 if per_evaluation == 1 else K_CRAFTED
        run = f"bench-{uuid.uuid4().hex[:6]}"
        events = crafted(evaluations, per_evaluation, k, run)
        topic = write_topic(settings, codec, events)
        expected = {f"{run}-e{number}" for number in range(evaluations)}
        rows[layout] = {
            "trajectories": len(events),
            "plain": plain_read(settings, codec, topic, len(events)),
            "state_logic": state_logic(codec, events),
            "processor": processor_read(broker, settings, codec, tmp / "home", topic, expected),
        }
        assert rows[layout]["state_logic"]["results"] == evaluations
        print(f"{layout}: processor {rows[layout]['processor']}", flush=True)
    return rows


# ---------------------------------------------------------------- the benchmark


@pytest.mark.timeout(600)
def test_evaluation_throughput_and_processor_overhead(broker, settings, tmp_path: Path) -> None:
    load_before = os.getloadavg()
    codec = EventCodec()
    measured = throughput(broker, settings, codec, tmp_path)
    crafted_runs = overhead(broker, settings, codec, tmp_path)
    load_after = os.getloadavg()

    rows, summary = [], {}
    for engine, by_k in measured["runs"].items():
        for k, rounds in by_k.items():
            key = f"{engine} k={k}"
            run = {
                name: sum(r[name] for r in rounds)
                for name in ("wall_s", "play_s", "score_s", "questions", "trajectories")
            }
            run["f1"] = min(r["f1"] for r in rounds)
            summary[key] = {**run, "rounds": rounds,
                            "questions_per_s": run["questions"] / run["wall_s"],
                            "trajectories_per_s": run["trajectories"] / run["wall_s"]}  # fmt: skip
            count = len(rounds)
            rows.append((
                key, count, run["questions"] // count, run["trajectories"] // count,
                f"{run['wall_s'] / count:.2f}", f"{summary[key]['questions_per_s']:.2f}",
                f"{summary[key]['trajectories_per_s']:.2f}", f"{run['play_s'] / count:.2f}",
                f"{run['score_s'] / count:.3f}", f"{run['f1']:.3f}", f"{rounds[0]['turns']:.1f}",
            ))  # fmt: skip
    show_table(
        f"evaluation throughput, {QUESTIONS} held-out world questions (first request -> "
        "EvalResult)",
        ["engine", "rounds", "questions", "trajectories", "wall s", "questions/s", "traj/s",
         "play s", "score s", "F1", "turns"],
        rows,
    )  # fmt: skip
    threads = measured["torch_threads"]
    print("torch threads, 2 x 3 generate calls of 64 tokens: "
          + ", ".join(f"{k} {v:.2f}" for k, v in threads.items()))  # fmt: skip
    # Expert answers are gold: anything else means the pipeline lost or garbled a trajectory.
    assert all(summary[f"expert k={k}"]["f1"] == 1.0 for k in SAMPLES)

    startup = crafted_runs["1 trajectory (start-up)"]["processor"]["wall_s"]
    rows = []
    for layout, run in crafted_runs.items():
        n, processor, plain, logic = (run["trajectories"], run["processor"], run["plain"],
                                      run["state_logic"])  # fmt: skip
        run["processor_ms_per_trajectory"] = processor["processing_s"] / n * 1000
        run["processor_marginal_ms_per_trajectory"] = (
            (processor["wall_s"] - startup) / (n - 1) * 1000 if n > 1 else None
        )
        # One record has no "after the first": the start-up run has no plain rate.
        run["plain_ms_per_trajectory"] = plain["after_first_s"] / (n - 1) * 1000 if n > 1 else None
        run["state_logic_ms_per_trajectory"] = logic["wall_s"] / n * 1000
        run["extra_ms_per_trajectory"] = (
            run["processor_ms_per_trajectory"] - run["plain_ms_per_trajectory"] if n > 1 else None
        )
        rows.append((
            layout, n, f"{processor['wall_s']:.2f}", f"{processor['startup_s']:.2f}",
            f"{processor['commit_s']:.2f}", _ms(run["processor_ms_per_trajectory"]),
            _ms(run["processor_marginal_ms_per_trajectory"]), _ms(run["plain_ms_per_trajectory"]),
            _ms(run["extra_ms_per_trajectory"]), _ms(run["state_logic_ms_per_trajectory"]),
            f"{logic['changelog_bytes'] / 1e6:.1f}", str(logic['largest_value_bytes']),
        ))  # fmt: skip
    show_table(
        "evaluation processor vs plain consumer + decode, same records, same run",
        ["layout", "N", "processor wall s", "start-up s", "commit s", "processor ms/traj",
         "(wall - start-up run) ms/traj", "plain ms/traj", "extra ms/traj",
         "state logic ms/traj", "changelog MB", "largest value B"],
        rows,
    )  # fmt: skip
    largest = {layout: crafted_runs[layout]["state_logic"]["largest_value_bytes"]
               for layout in ("1 eval x 125 q x 4", "1 eval x 500 q x 4")}  # fmt: skip
    write_results("eval", {
        "questions": QUESTIONS, "engines": {n: {"max_turns": t, "max_new_tokens": m}
                                            for n, (t, m, _) in ENGINES.items()},
        "throughput": summary, "transformers_parameters": measured["transformers_parameters"],
        "torch_threads_check": threads, "throughput_processor_exit": measured["processor_exit"],
        "processor_overhead": crafted_runs, "crafted_tokens_per_trajectory": TOKENS,
        "largest_table_value_bytes": largest,
        "load_average_before": load_before, "load_average_after": load_after,
    })  # fmt: skip


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
