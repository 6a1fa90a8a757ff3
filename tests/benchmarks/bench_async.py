"""Synchronous, one-step-off and fully asynchronous RL, side by side on one heavy-tailed workload.

The whole topology runs as a user runs it (`stream up` against the session's broker), once per
staleness bound η: 0 (synchronous: a producer starts a batch's groups only for the current
version, and the trainer steps only on a whole batch), 1 (one-step-off) and 4 (the paper's
fully asynchronous setting). Generation is the timed stand-in workflow "timed": trajectories of
a heavy-tailed number of turns and tokens that wait what an engine (`token_s` per token) and
the tools (log-normal latency) would take, so generation costs no CPU and the real trainer
(DeepSpeed on the CPU policy) has the cores, as if the two ran on separate devices. Everything
else is the same in every mode.

Per mode, over the window after the first step: trajectories trained per second, the trainer's
idle fraction (time waiting for a batch, as it reports it), the producers' generation idle
fraction (time with free slots held back by the staleness bound) and the staleness of trained
samples. Knobs: ASEARCHER_BENCH_MINUTES (per mode, default 3), ASEARCHER_BENCH_ETAS
(default "0,1,4"). Writes results/async.json and results/async.png.

ASEARCHER_BENCH_ENGINE=transformers runs the same comparison with the real CPU policy writing
every turn (the timed workflow with `engine_writes`, shorter turns so a trajectory fits the
policy's speed), so generation and the trainer share this machine's 2 cores as they would in a
CPU-only run; it writes results/async-cpu.json and results/async-cpu.png.
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

from asearcher.producers.timed_workflow import ENV_WORKLOAD, TimedWorkload
from asearcher.streams.events import ServiceStatus, TrainerStepFinished
from asearcher.streams.topics import SERVICE_STATUS, TRAINER_METRICS
from tests.rollout_support import events_of

ASEARCHER = str(Path(sys.executable).parent / "asearcher")
MINUTES = float(os.environ.get("ASEARCHER_BENCH_MINUTES", "3"))
ETAS = [int(e) for e in os.environ.get("ASEARCHER_BENCH_ETAS", "0,1,4").split(",")]
ENGINE = os.environ.get("ASEARCHER_BENCH_ENGINE", "expert")
WORKLOADS = {
    "expert": TimedWorkload(token_s=0.004, tool_median_s=0.3, seed=None),
    "transformers": TimedWorkload(tokens_median=24, max_tokens=192, max_turns=12,
                                  observation_tokens=48, prompt_tokens=48, tool_median_s=0.3,
                                  engine_writes=True, seed=None),
}  # fmt: skip
WORKLOAD = WORKLOADS[ENGINE]
RESULTS = "async" if ENGINE == "expert" else "async-cpu"
RUN = """
name = "{name}"
[data]
world_entities = 60
dense = false
[rollout]
engine = "{engine}"
[rollout.config]
workflow = "timed"
concurrency = 32
status_every_s = 1
[trainer.config]
status_every_s = 1
[trainer.config.batching]
groups_per_batch = 4
eta = {eta}
[feeder.config]
epochs = 0
group_size = 4
outstanding = 64
[eval]
replicas = 0
"""


def play(home: Path, bootstrap: str, eta: int) -> str:
    """Bring a run with bound `eta` up, let it train for MINUTES, bring it down; its name."""
    name = f"async{eta}-{uuid.uuid4().hex[:6]}"
    config = home / f"{name}.toml"
    config.write_text(RUN.format(name=name, eta=eta, engine=ENGINE))
    env = {**os.environ, "ASEARCHER_HOME": str(home), "ASEARCHER_BOOTSTRAP_SERVERS": bootstrap,
           ENV_WORKLOAD: msgspec.json.encode(WORKLOAD).decode()}  # fmt: skip
    up = subprocess.run([ASEARCHER, "stream", "up", "-c", str(config)], env=env, cwd="/",
                        capture_output=True, text=True, timeout=600)  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    time.sleep(60 * MINUTES)
    subprocess.run([ASEARCHER, "stream", "down", "--keep-broker"], env=env, cwd="/",
                   capture_output=True, text=True, timeout=600)  # fmt: skip
    return name


def measure(settings, codec, name: str, eta: int) -> dict:
    steps = sorted(
        (e for e in events_of(settings, codec, TRAINER_METRICS)
         if isinstance(e, TrainerStepFinished) and e.model == name),
        key=lambda e: e.created_at,
    )  # fmt: skip
    assert len(steps) >= 3, f"only {len(steps)} steps at eta {eta}"
    window = steps[-1].created_at - steps[0].created_at
    trained = sum(s.samples for s in steps[1:])  # what the window's steps trained
    staleness = [0] * 16
    for step in steps:
        for k, n in enumerate(step.staleness_counts):
            staleness[k] += n
    samples = sum(staleness)
    beats = [e for e in events_of(settings, codec, SERVICE_STATUS)
             if isinstance(e, ServiceStatus) and e.instance == f"{name}-rollout-0"]  # fmt: skip
    last = max(beats, key=lambda b: b.created_at).counters
    generated = last["trajectories"] / last["trajectories_per_s"]  # the producer's lifetime
    return {
        "eta": eta,
        "steps": len(steps),
        "samples_per_s": trained / window,
        "trainer_idle": sum(s.idle_fraction for s in steps[1:]) / (len(steps) - 1),
        "generation_idle": last["staleness_wait_s"] / generated,
        "staleness_mean": sum(k * n for k, n in enumerate(staleness)) / max(samples, 1),
        "staleness_max": max((k for k, n in enumerate(staleness) if n), default=0),
        "window_s": window,
    }


def plot(results: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    labels = [f"η={r['eta']}" for r in results]
    axes[0].bar(labels, [r["samples_per_s"] for r in results], color="tab:blue")
    axes[0].set_ylabel("trajectories trained / s")
    axes[1].bar(labels, [100 * r["trainer_idle"] for r in results], color="tab:orange")
    axes[1].set_ylabel("trainer idle %")
    generation = "timed generation" if ENGINE == "expert" else "real CPU policy generating"
    figure.suptitle(f"heavy-tailed workload, {generation}, real CPU trainer")
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


@pytest.mark.benchmark
@pytest.mark.timeout(7200)
def test_async_against_sync_on_a_heavy_tailed_workload(broker, settings, codec, tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    results = [measure(settings, codec, play(home, broker.bootstrap_servers, eta), eta)
               for eta in ETAS]  # fmt: skip
    sync = next((r for r in results if r["eta"] == 0), results[0])
    rows = [[r["eta"], r["steps"], f"{r['samples_per_s']:.2f}",
             f"{r['samples_per_s'] / sync['samples_per_s']:.2f}x",
             f"{100 * r['trainer_idle']:.0f}%", f"{100 * r['generation_idle']:.0f}%",
             f"{r['staleness_mean']:.2f}", r["staleness_max"]] for r in results]  # fmt: skip
    show_table(
        f"async vs sync, {MINUTES:g} min per mode ({ENGINE} engine, timed workflow, CPU trainer)",
        ["eta", "steps", "trajectories/s", "vs sync", "trainer idle", "generation idle",
         "staleness mean", "staleness max"],
        rows,
    )  # fmt: skip
    figure = plot(results, Path(__file__).parent / "results" / f"{RESULTS}.png")
    write_results(RESULTS, {"engine": ENGINE, "minutes_per_mode": MINUTES,
                            "workload": msgspec.to_builtins(WORKLOAD), "modes": results,
                            "figure": figure.name})  # fmt: skip
