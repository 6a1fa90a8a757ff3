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
import time
import uuid
from pathlib import Path

import msgspec
import pytest
from harness import show_table, write_results
from topology_runs import generation_idle, run_up, trainer_figures

from asearcher.producers.agents.timed_workflow import TimedWorkload

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


def measure(settings, codec, home: Path, bootstrap: str, eta: int) -> dict:
    """Bring a run with bound `eta` up, let it train for MINUTES, bring it down; its figures."""
    name = f"async{eta}-{uuid.uuid4().hex[:6]}"
    with run_up(home, bootstrap, name, RUN.format(name=name, eta=eta, engine=ENGINE), WORKLOAD):
        time.sleep(60 * MINUTES)
    return {"eta": eta, **trainer_figures(settings, codec, name, least_steps=3),
            "generation_idle": generation_idle(settings, codec, name)}  # fmt: skip


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
    results = [measure(settings, codec, home, broker.bootstrap_servers, eta) for eta in ETAS]
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
