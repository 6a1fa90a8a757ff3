"""How far clones of the same demonstrations differ by the order they are cloned in.

The learning run's warm start clones the scripted expert's demonstrations with one fixed
shuffle seed, starting from the order in which they reached Kafka; that order changes from run
to run. This benchmark clones the same demonstrations (those of run `learn` on
`expert.trajectories`, as the warm start does, with its epochs, batch and rate) once per
shuffle seed, each into its own weight store, and plays each clone in this process on every
held-out question of the run's world x 2 at the run's evaluation sampling, beside the
evaluation's own standard error. Clones that differ by more than that error are what a
"best of several orders" warm start could choose between.

It needs a home where `asearcher learn` has run (the world, the policy and the demonstrations
on its broker's topic): `ASEARCHER_BENCH_HOME=<home> ASEARCHER_BENCH_ORDERS=0,1,2,3
.venv/bin/python -m pytest tests/benchmarks/bench_clone_orders.py -m benchmark -s`
(about 3 minutes an order on 2 cores). Results: results/clone-orders.json.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest
from harness import show_table, write_results

from tests.support.runs import ASEARCHER

ORDERS = [int(s) for s in os.environ.get("ASEARCHER_BENCH_ORDERS", "0,1,2,3").split(",")]
HOME = os.environ.get("ASEARCHER_BENCH_HOME", "")
SAMPLES = 2
RUN = "learn"


class Quiet:
    """Where the agent's steps go: nowhere (only the scores are wanted)."""

    def emit(self, event: object) -> None:
        return None


def clone(home: Path, order: int, settings, config, where):  # type: ignore[no-untyped-def]
    """The run's demonstrations cloned with shuffle seed `order`, into a store of its own."""
    from asearcher.cli.run.warm_start import cloning_config
    from asearcher.streams.wire.codec import EventCodec
    from asearcher.trainer.runtime.weight_publisher import WeightStore
    from asearcher.trainer.sft.sft_job import SftJob

    sft = cloning_config(config, model=f"order{order}", seed=order)
    store = (home / "bench-clone-orders" / f"order-{order}").as_uri()
    job = SftJob(settings, EventCodec(), sft, where.model_dir, WeightStore(store))
    data = job.data()
    results = job.train(data)
    return store, job.publish(data, results), results


async def held_out_f1(policy, tools, agent, questions, sampling) -> list[float]:  # type: ignore[no-untyped-def]
    """Each held-out question's mean F1 over `SAMPLES` plays."""
    from asearcher.producers.agents.agent import run_trajectory
    from asearcher.streams.wire.events import RolloutRequested, new_id

    scores = []
    for question in questions:
        plays = []
        for _ in range(SAMPLES):
            request = RolloutRequested(
                question_id=new_id(), group_id=new_id(), question=question.question,
                gold_answers=list(question.answers), group_size=1, purpose="eval",
                sampling=sampling,
            )  # fmt: skip
            done = await run_trajectory(request, 0, policy, tools, Quiet(), agent)
            plays.append(done.reward_parts.get("f1", 0.0))
        scores.append(statistics.mean(plays))
    return scores


@pytest.mark.benchmark
@pytest.mark.timeout(len(ORDERS) * 600 + 300)
def test_clone_orders() -> None:
    from asearcher.cli.jobs.evaluation import benchmark_questions
    from asearcher.cli.run.config import paths, resolve
    from asearcher.cli.wiring import chosen_run_config
    from asearcher.consumers.tools.toolbox import Toolbox, build_backends
    from asearcher.producers.engines.registry import make_engine
    from asearcher.producers.rollout.tool_router import InProcessToolClient
    from asearcher.streams.cluster.settings import KafkaSettings, local_bootstrap
    from asearcher.streams.storage.weight_reader import WeightStoreReader
    from asearcher.streams.wire.events import SamplingSettings

    assert HOME, "set ASEARCHER_BENCH_HOME to a home where `asearcher learn` has run"
    home = Path(HOME)
    subprocess.run([ASEARCHER, "stream", "up", "--broker-only", "--home", HOME], check=True)
    config = chosen_run_config(None, RUN, home)
    where = paths(config, home)
    resolved = resolve(config, where)
    settings = KafkaSettings(bootstrap_servers=local_bootstrap(home))
    questions = benchmark_questions("world", None, "test", where.world_dir, None)
    search, reader = build_backends(resolved.tools)
    tools = InProcessToolClient(Toolbox(search, reader, resolved.tools))
    ev = config.eval.config.sampling
    sampling = SamplingSettings(temperature=ev.temperature, top_p=ev.top_p,
                                max_turns=ev.max_turns,
                                max_new_tokens_per_turn=ev.max_new_tokens_per_turn)  # fmt: skip
    rows = []
    for order in ORDERS:
        started = time.monotonic()
        store, published, results = clone(home, order, settings, config, where)
        policy = make_engine("transformers", where.model_dir)
        version = WeightStoreReader(store).get(published.version)
        asyncio.run(policy.load_weights(version.uri, published.version, version.sha256))
        scores = asyncio.run(held_out_f1(policy, tools, resolved.evaluator.agent, questions,
                                         sampling))  # fmt: skip
        rows.append({
            "order": order, "f1": statistics.mean(scores),
            "standard_error": statistics.stdev(scores) / len(scores) ** 0.5,
            "per_question": scores, "steps": len(results),
            "loss_first": results[0].stats.loss, "loss_last": results[-1].stats.loss,
            "seconds": time.monotonic() - started,
        })  # fmt: skip
    show_table(
        f"clones of run {RUN!r}'s demonstrations by shuffle order, held-out F1 "
        f"({len(questions)} q x {SAMPLES})",
        ["order", "F1", "standard error", "steps", "loss first -> last", "seconds"],
        [[r["order"], f"{r['f1']:.3f}", f"±{r['standard_error'] * 100:.1f} pts", r["steps"],
          f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}", f"{r['seconds']:.0f}"]
         for r in rows],
    )  # fmt: skip
    f1 = [float(r["f1"]) for r in rows]
    spread = statistics.stdev(f1) if len(f1) > 1 else 0.0
    print(f"orders: F1 {min(f1):.3f}-{max(f1):.3f}, sd {spread * 100:.1f} points")
    write_results("clone-orders", {"home": HOME, "samples": SAMPLES, "f1_sd": spread,
                                   "orders": rows})  # fmt: skip
    assert all(r["steps"] for r in rows)
