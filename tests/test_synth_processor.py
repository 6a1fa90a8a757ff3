"""The synthesis processor and `asearcher synth run`, against the test broker.

Everything is real: the CLI and the processors in subprocesses (Kafka transactions), a
tool worker reading pages from the world's index over Kafka, the rule-based roles on the
world's graph. Output is read back with read_committed consumers.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from asearcher.consumers.tools.local_index import LocalIndex, build_index
from asearcher.consumers.tools.tool_thread import ToolWorkerThread
from asearcher.consumers.tools.toolbox import LocalReader, LocalSearch, Toolbox, ToolConfig
from asearcher.consumers.world.world import WorldQuestion, generate_world, write_world
from asearcher.producers.agents.agent import AgentConfig, run_trajectory
from asearcher.producers.engines.registry import make_engine
from asearcher.producers.rollout.feeder import FeederConfig, FeederService, FeederTopics
from asearcher.producers.rollout.tool_router import InProcessToolClient
from asearcher.producers.synthesis.agent import SynthConfig
from asearcher.producers.synthesis.processor import SynthProcessorConfig
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import (
    DeadLetter,
    QuestionSynthesized,
    RolloutRequested,
    SynthesisCandidate,
    SynthesisRequested,
)
from asearcher.streams.wire.topics import (
    DEAD_LETTERS,
    FEEDER_PROGRESS,
    ROLLOUT_REQUESTS,
    SERVICE_STATUS,
    SYNTH_ACCEPTED,
    SYNTH_CANDIDATES,
    SYNTH_REJECTED,
    SYNTH_REQUESTS,
    TOOL_CALLS,
    TOOL_RESULTS,
    TRAJECTORIES,
)
from tests.conftest import read_raw
from tests.support.processors import processor, wait_for
from tests.support.rollout import events_of
from tests.support.runs import ASEARCHER
from tests.support.trainer import tiny_model_dir

WORLD = {"seed": 0, "entities": 60, "questions": 200, "max_hops": 2, "filler": False}
RUN = """
name = "{name}"
[data]
world_entities = 60
world_questions = 200
world_max_hops = 2
world_filler = false
dense = false
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The test world, written and indexed once."""
    root = tmp_path_factory.mktemp("synth-world")
    world = generate_world(**WORLD)
    files = write_world(world, root)
    build_index(files["corpus"], root / "index", dense=False)
    return world, root


def seed_lines(questions: list[WorldQuestion]) -> bytes:
    return b"".join(
        msgspec.json.encode({"id": q.id, "question": q.question, "answer": q.answers[0]}) + b"\n"
        for q in questions
    )


def outcomes_on(settings, codec, *topics: str) -> list[QuestionSynthesized]:
    return [e for t in topics for e in events_of(settings, codec, t)
            if isinstance(e, QuestionSynthesized)]  # fmt: skip


def describe_repeats(settings, codec, per_seed: Counter, running, *topics: str) -> str:
    """For each seed with more than one outcome: its records (requests and outcomes, with
    partition, offset and time) and every processor log line naming it."""
    lines = []
    for seed_id in (s for s, n in per_seed.items() if n > 1):
        lines.append(f"seed {seed_id} has {per_seed[seed_id]} outcomes:")
        for topic in topics:
            for message in read_raw(settings, topic):
                if seed_id.encode() in (message.value() or b""):
                    lines.append(f"  {topic}[{message.partition()}]@{message.offset()} "
                                 f"t={message.timestamp()[1]}")  # fmt: skip
        for log in sorted(running.tmp_path.glob("processor-*.log")):
            lines += [f"  {log.name}: {line}" for line in log.read_text(errors="replace")
                      .splitlines() if seed_id in line]  # fmt: skip
    for log in sorted(running.tmp_path.glob("processor-*.log")):
        lines += [f"  {log.name}: {line}" for line in log.read_text(errors="replace")
                  .splitlines() if re.search("assigned|revoked|repeats a request|fenced", line,
                                             re.IGNORECASE)]  # fmt: skip
    return "\n".join(lines)


# ---------------------------------------------------------------- synth run, as a user runs it


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_synth_run_writes_harder_questions_the_feeder_and_the_expert_take_as_is(
    broker, settings, codec, world, make_topic, tmp_path: Path
) -> None:
    world_data, root = world
    seeds = [q for q in world_data.questions if q.split == "train"][:16]
    seed_file = tmp_path / "seeds.jsonl"
    seed_file.write_bytes(seed_lines(seeds))
    home = tmp_path / "home"
    home.mkdir()
    (home / "run.toml").write_text(RUN.format(name=f"s{uuid.uuid4().hex[:6]}"))
    out = tmp_path / "accepted.jsonl"
    job = f"j{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "ASEARCHER_HOME": str(home), "COLUMNS": "200",
           "ASEARCHER_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
           "BROKER_SESSION_TIMEOUT": "10", "BROKER_HEARTBEAT_INTERVAL": "1"}  # fmt: skip
    args = [ASEARCHER, "synth", "run", "--seed", str(seed_file), "--out", str(out), "--job", job,
            "-c", str(home / "run.toml"), "--figures", str(tmp_path / "figures")]  # fmt: skip
    first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=420, cwd="/")
    output = first.stdout + first.stderr
    assert first.returncode == 0, output[-5000:]

    accepted = [msgspec.json.decode(line) for line in out.read_bytes().splitlines()]
    by_question = {q.question: q for q in seeds}
    assert accepted and f"{len(accepted)} accepted questions written" in output, output[-5000:]
    for record in accepted:
        seed = by_question[record["seed_question"]]
        assert record["answers"] == seed.answers  # the answer never changes
        assert record["hops"] > seed.hops  # and the question needs more pages than its seed
        assert {e["action"] for e in record["edits"]} <= {"base", "inject", "fuzz"}
    assert f"of {len(seeds)} seeds accepted" in output and "difficulty" in output
    assert (tmp_path / "figures" / "synthesis.png").stat().st_size > 10_000

    # One outcome per seed on the topics; a second run of the job finds them all done.
    mine = [o for o in outcomes_on(settings, codec, SYNTH_ACCEPTED, SYNTH_REJECTED)
            if o.metadata.get("job") == job]  # fmt: skip
    assert len(mine) == len(seeds) == len({o.seed_id for o in mine})
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240, cwd="/")
    assert again.returncode == 0 and f"{len(seeds)} done already" in again.stdout, again.stdout
    assert [msgspec.json.decode(line) for line in out.read_bytes().splitlines()] == accepted

    # The file trains as is: the feeder turns every question into a request, and the scripted
    # expert, following the questions' pages with the real tools, earns the full reward.
    requests = feed(settings, codec, make_topic, out)
    assert sorted(r.question for r in requests) == sorted(r["question"] for r in accepted)
    rewards = play_expert(requests, out, LocalIndex(root / "index"), tmp_path)
    assert rewards == [1.0] * len(requests)

    # Seeds from pages of the world: each page gets a base question answered on it.
    pages = [ASEARCHER, "synth", "run", "--pages", "6", "--job", f"{job}p", "--out",
             str(tmp_path / "paged.jsonl"), "-c", str(home / "run.toml")]  # fmt: skip
    paged = subprocess.run(pages, env=env, capture_output=True, text=True, timeout=240, cwd="/")
    assert paged.returncode == 0 and "6 seeds, 0 done already" in paged.stdout, paged.stdout
    # Its processors start after the first job's seeds: they never read them.
    skipped = re.search(r"starting after the ([\d,]+) seeds already on synth", paged.stdout)
    assert skipped and int(skipped[1].replace(",", "")) >= len(seeds), paged.stdout
    page_outcomes = [o for o in outcomes_on(settings, codec, SYNTH_ACCEPTED, SYNTH_REJECTED)
                     if o.metadata.get("job") == f"{job}p"]  # fmt: skip
    assert len(page_outcomes) == 6
    assert all(o.edits and o.edits[0].action == "base" for o in page_outcomes if o.accepted)


def feed(settings, codec, make_topic, qa: Path) -> list[RolloutRequested]:
    topics = FeederTopics(
        requests=make_topic(like=ROLLOUT_REQUESTS), trajectories=make_topic(like=TRAJECTORIES),
        progress=make_topic(like=FEEDER_PROGRESS), status=make_topic(like=SERVICE_STATUS),
        dead_letters=make_topic(like="dead.letters"),
    )  # fmt: skip
    config = FeederConfig(qa=str(qa), run=f"r{uuid.uuid4().hex[:6]}", group_size=1,
                          outstanding=1000, topics=topics)  # fmt: skip
    with FeederService(settings, codec, config) as feeder:
        feeder.run(exit_when_done=True, timeout=30)
    return [e for e in events_of(settings, codec, topics.requests)
            if isinstance(e, RolloutRequested)]  # fmt: skip


def play_expert(requests: list[RolloutRequested], qa: Path, index: LocalIndex, tmp_path: Path
                ) -> list[float]:  # fmt: skip
    engine = make_engine("expert", tiny_model_dir(tmp_path / "policy"), qa_file=qa)
    tools = InProcessToolClient(Toolbox(LocalSearch(index, "bm25"), LocalReader(index),
                                        ToolConfig()))  # fmt: skip

    class Sink:
        def emit(self, event) -> None:
            pass

    async def play_all() -> list[float]:
        played = []
        for request in requests:
            done = await run_trajectory(request, 0, engine, tools, Sink(), AgentConfig())
            played.append(done.reward)
        return played

    return asyncio.run(play_all())


# ---------------------------------------------------------------- kill -9


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_processor_killed_mid_run_repeats_no_seed_and_a_seed_sent_again_is_not_lost(
    settings, codec, claims, world, make_topic, tmp_path: Path
) -> None:
    world_data, root = world
    job = f"k{uuid.uuid4().hex[:6]}"
    config = SynthProcessorConfig(
        app_id=f"synth-test-{uuid.uuid4().hex[:8]}", job=job, world_seed=0, world_entities=60,
        instance="0", synthesis=SynthConfig(max_edits=6), pause_per_seed_s=0.2,
        requests_topic=make_topic(like=SYNTH_REQUESTS),
        candidates_topic=make_topic(like=SYNTH_CANDIDATES),
        accepted_topic=make_topic(like=SYNTH_ACCEPTED),
        rejected_topic=make_topic(like=SYNTH_REJECTED),
        tool_calls_topic=make_topic(like=TOOL_CALLS),
        tool_results_topic=make_topic(like=TOOL_RESULTS),
    )  # fmt: skip
    seeds = [SynthesisRequested(seed_id=f"{job}-{q.id}", question=q.question, answer=q.answers[0],
                                metadata={"job": job})
             for q in world_data.questions if q.split == "train"][:40]  # fmt: skip
    tools = ToolConfig(index_dir=str(root / "index"))

    def outcomes() -> list[QuestionSynthesized]:
        return outcomes_on(settings, codec, config.accepted_topic, config.rejected_topic)

    command = ("synth", "process")
    with (
        ToolWorkerThread(settings, codec, tools, (tmp_path / "results").as_uri(), f"t-{job}",
                         calls_topic=config.tool_calls_topic,
                         results_topic=config.tool_results_topic),
        EventProducer(settings, codec) as producer,
        processor(settings, claims, config, tmp_path, command) as running,
    ):  # fmt: skip
        for seed in seeds:
            producer.send(config.requests_topic, seed)
        producer.flush()
        wait_for(lambda: len(outcomes()) >= 5, "the first outcomes", running)
        running.kill()
        done_before = len(outcomes())
        assert done_before < len(seeds), "the kill came too late to land mid-run"
        for seed in seeds[:5]:  # sent again: each still gets one outcome
            producer.send(config.requests_topic, seed)
        invalid = SynthesisRequested(seed_id=f"{job}-no-question", metadata={"job": job})
        producer.send(config.requests_topic, invalid)
        producer.flush()
        running.start()

        def missing() -> list[SynthesisRequested]:
            have = {o.seed_id for o in outcomes()}
            return [s for s in seeds if s.seed_id not in have]

        # Restarted under its instance name, the processor fences its killed predecessor (whose
        # open transaction is aborted) and takes its partitions back at once.
        wait_for(
            lambda: not missing(),
            "every seed's outcome",
            running,
            240,
            describe=lambda: f"without an outcome: {[s.seed_id for s in missing()]}",
        )
        time.sleep(3)  # anything sent twice would be committed by now

    per_seed = Counter(o.seed_id for o in outcomes())
    assert set(per_seed) == {s.seed_id for s in seeds}
    assert set(per_seed.values()) == {1}, describe_repeats(
        settings,
        codec,
        per_seed,
        running,
        config.requests_topic,
        config.accepted_topic,
        config.rejected_topic,
    )
    candidates = [e for e in events_of(settings, codec, config.candidates_topic)
                  if isinstance(e, SynthesisCandidate)]  # fmt: skip
    keys = Counter((c.seed_id, c.index) for c in candidates)
    assert set(keys.values()) == {1}  # the killed transaction's candidates were never committed
    assert {seed for seed, _ in keys} == set(per_seed)
    assert sum(o.accepted for o in outcomes()) > 0
    letters = [e for e in events_of(settings, codec, DEAD_LETTERS) if isinstance(e, DeadLetter)
               and e.origin_topic == config.requests_topic]  # fmt: skip
    assert letters and all("a seed needs seed_id and a question" in e.reason for e in letters)
