"""Data synthesis on the world: accepted questions per minute and each gate's acceptance, with 1
and 2 synthesis processors.

`asearcher synth run` runs as a user runs it (a subprocess against the session's broker) on the
default run's world (300 entities) with the rule-based writer and checker, once per replica
count, each a fresh job over the same seeds (the first N train questions). The rate is taken
from the job's own events: seeds with an outcome divided by the time from the first candidate
to the last outcome (processor start-up excluded); the command's wall time is recorded too.
Both replica counts run side by side in one session; the two cores are shared by the
processors, the tool worker (in the command's process) and the broker, so more replicas can
only help as far as those have room. Knobs: ASEARCHER_BENCH_SEEDS (default 120). Writes
results/synth.json.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest
from harness import show_table, write_results

from asearcher.consumers.synth_stats import synth_stats
from asearcher.consumers.world import generate_world
from asearcher.streams.events import QuestionSynthesized, SynthesisCandidate
from asearcher.streams.topics import SYNTH_ACCEPTED, SYNTH_CANDIDATES, SYNTH_REJECTED
from tests.rollout_support import events_of

ASEARCHER = str(Path(sys.executable).parent / "asearcher")
SEEDS = int(os.environ.get("ASEARCHER_BENCH_SEEDS", "120"))


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


@pytest.mark.benchmark
@pytest.mark.timeout(3600)
def test_synthesis_rate_with_one_and_two_processors(broker, settings, codec, tmp_path) -> None:
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
    for replicas in (1, 2):
        job = f"bench{replicas}-{uuid.uuid4().hex[:6]}"
        args = [
            ASEARCHER,
            "synth",
            "run",
            "--seed",
            str(seed_file),
            "--job",
            job,
            "--replicas",
            str(replicas),
            "--out",
            str(tmp_path / f"{job}.jsonl"),
            "--figures",
            str(tmp_path / job),
        ]
        started = time.monotonic()
        done = subprocess.run(args, env=env, capture_output=True, text=True, cwd="/")
        wall = time.monotonic() - started
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        outcomes, candidates = job_events(settings, codec, job)
        span = max(o.created_at for o in outcomes) - min(c.created_at for c in candidates)
        stats = synth_stats(outcomes, candidates)
        gates = {g.gate: g.rate for g in stats.gates}
        results[str(replicas)] = {
            "seeds": len(outcomes),
            "accepted": stats.accepted,
            "wall_s": wall,
            "span_s": span,
            "seeds_per_min": 60 * len(outcomes) / span,
            "accepted_per_min": 60 * stats.accepted / span,
            "gates": gates,
            "candidates": len(candidates),
            "role_failures": stats.role_failures,
        }
        rows.append(
            [
                replicas,
                len(outcomes),
                stats.accepted,
                f"{60 * stats.accepted / span:.0f}",
                f"{60 * len(outcomes) / span:.0f}",
                f"{span:.1f}",
                f"{wall:.0f}",
                *(f"{100 * gates[g]:.0f}%" for g in ("quality", "difficulty", "uniqueness")),
            ]
        )
    show_table(
        f"synthesis on the world ({SEEDS} seeds, rule-based roles)",
        [
            "processors",
            "seeds",
            "accepted",
            "accepted/min",
            "seeds/min",
            "span s",
            "wall s",
            "quality",
            "difficulty",
            "uniqueness",
        ],
        rows,
    )
    ratio = results["2"]["seeds_per_min"] / results["1"]["seeds_per_min"]
    print(f"2 processors / 1: {ratio:.2f}x seeds per minute")
    write_results("synth", {"seeds": SEEDS, "replicas": results, "two_over_one": ratio})
    assert results["1"]["seeds"] == results["2"]["seeds"] == SEEDS
