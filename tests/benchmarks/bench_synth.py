"""Data synthesis on the world: accepted questions per minute and each gate's acceptance, with
1, 2 and 4 synthesis processors.

`asearcher synth run` runs as a user runs it (a subprocess against the session's broker) on the
default run's world (300 entities) with the rule-based writer and checker, once per replica
count, each a fresh job over the same seeds (the first N train questions). Two role costs:
the rule-based roles as they are (a seed costs milliseconds), and the same roles with a model's
latency laid on every call (`--role-latency`), where a seed costs what its model calls cost, as
with LLM roles. The rate is taken from the job's own events: seeds with an outcome divided by
the time from the first candidate to the last outcome (processor start-up excluded); the
command's wall time is recorded too. Everything runs side by side in one session; the two cores
are shared by the processors, the tool worker (in the command's process) and the broker.
Knobs: ASEARCHER_BENCH_SEEDS (default 120), ASEARCHER_BENCH_ROLE_LATENCY (seconds per role
call, default 0.05). Writes results/synth.json.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import msgspec
import pytest
from harness import show_table, write_results

from asearcher.consumers.synthesis.stats import synth_stats
from asearcher.consumers.world.world import generate_world
from asearcher.streams.wire.events import QuestionSynthesized, SynthesisCandidate
from asearcher.streams.wire.topics import SYNTH_ACCEPTED, SYNTH_CANDIDATES, SYNTH_REJECTED
from tests.support.rollout import events_of
from tests.support.runs import ASEARCHER

SEEDS = int(os.environ.get("ASEARCHER_BENCH_SEEDS", "120"))
ROLE_LATENCY = float(os.environ.get("ASEARCHER_BENCH_ROLE_LATENCY", "0.05"))
REPLICAS = (1, 2, 4)


def job_events(settings, codec, job: str) -> tuple[list[QuestionSynthesized], list]:
    outcomes = [
        e
        for t in (SYNTH_ACCEPTED, SYNTH_REJECTED)
        for e in events_of(settings, codec, t)
        if isinstance(e, QuestionSynthesized) and e.metadata.get("job") == job
    ]
    ids = {o.seed_id for o in outcomes}
    candidates = [
        e
        for e in events_of(settings, codec, SYNTH_CANDIDATES)
        if isinstance(e, SynthesisCandidate) and e.seed_id in ids
    ]
    return outcomes, candidates


def synth_job(env: dict, seed_file: Path, tmp_path: Path, replicas: int, latency: float):
    job = f"bench{replicas}-{uuid.uuid4().hex[:6]}"
    args = [ASEARCHER, "synth", "run", "--seed", str(seed_file), "--job", job,
            "--replicas", str(replicas), "--role-latency", str(latency),
            "--out", str(tmp_path / f"{job}.jsonl"), "--figures", str(tmp_path / job)]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(args, env=env, capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return job, time.monotonic() - started


def measure(settings, codec, job: str, wall: float) -> dict:
    outcomes, candidates = job_events(settings, codec, job)
    span = max(o.created_at for o in outcomes) - min(c.created_at for c in candidates)
    stats = synth_stats(outcomes, candidates)
    return {
        "seeds": len(outcomes),
        "accepted": stats.accepted,
        "wall_s": wall,
        "span_s": span,
        "seeds_per_min": 60 * len(outcomes) / span,
        "accepted_per_min": 60 * stats.accepted / span,
        "gates": {g.gate: g.rate for g in stats.gates},
        "candidates": len(candidates),
        "role_failures": stats.role_failures,
    }


def table_row(latency: float, replicas: int, result: dict, speedup: float) -> list:
    gates = result["gates"]
    return [
        f"{1000 * latency:.0f} ms" if latency else "none",
        replicas,
        result["seeds"],
        result["accepted"],
        f"{result['accepted_per_min']:.0f}",
        f"{result['seeds_per_min']:.0f}",
        f"{speedup:.2f}x",
        f"{result['span_s']:.1f}",
        f"{result['wall_s']:.0f}",
        *(f"{100 * gates[g]:.0f}%" for g in ("quality", "difficulty", "uniqueness")),
    ]


@pytest.mark.benchmark
@pytest.mark.timeout(3600)
def test_synthesis_rate_with_more_processors(broker, settings, codec, tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    seeds = [q for q in generate_world().questions if q.split == "train"][:SEEDS]
    seed_file = tmp_path / "seeds.jsonl"
    seed_file.write_bytes(
        b"".join(
            msgspec.json.encode({"question": q.question, "answer": q.answers[0]}) + b"\n"
            for q in seeds
        )
    )
    env = {
        **os.environ,
        "ASEARCHER_HOME": str(home),
        "ASEARCHER_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
    }
    rows, results = [], {}
    for latency in (0.0, ROLE_LATENCY):
        by_replicas = {}
        for replicas in REPLICAS:
            job, wall = synth_job(env, seed_file, tmp_path, replicas, latency)
            result = by_replicas[str(replicas)] = measure(settings, codec, job, wall)
            result["speedup"] = result["seeds_per_min"] / by_replicas["1"]["seeds_per_min"]
            rows.append(table_row(latency, replicas, result, result["speedup"]))
            assert result["seeds"] == SEEDS
        results[f"latency_{latency}"] = {"role_latency_s": latency, "replicas": by_replicas}
    show_table(
        f"synthesis on the world ({SEEDS} seeds, rule-based roles)",
        ["model latency per call", "processors", "seeds", "accepted", "accepted/min",
         "seeds/min", "vs 1", "span s", "wall s", "quality", "difficulty", "uniqueness"],
        rows,
    )  # fmt: skip
    write_results("synth", {"seeds": SEEDS, "runs": results})
