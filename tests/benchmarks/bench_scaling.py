"""Throughput against the number of producers, per staleness bound, with generation and the
trainer step on "other devices": where does the async advantage peak, and what becomes the
bottleneck first (the broker, the codec, one trainer consumer, a rollout process)?

Every point is the whole topology as a user runs it (`stream up` against the session's broker).
Generation is the timed stand-in workflow "timed" (the engine's time per token and the tools'
latency are waits, heavy-tailed trajectories), and the trainer's step is timed too
(`trainer.config.timed_step`: a fixed part for the optimiser step and the weight sync plus a
part per trajectory), so what is left on this machine's cores is the system itself: rollout
processes producing every step and trajectory event, the broker, the trainer consuming and
batching, weight versions published and followed. "Producers" are concurrent trajectories
(one engine's worth of generation each), spread over rollout processes of at most
`PER_PROCESS` each. A synchronous batch holds one trajectory per producer (η = 0: generation
waits for the step, the step for the whole batch), the asynchronous modes use the same batch.

Per point: trajectories trained per second, the trainer's idle fraction, the producers'
generation idle fraction, staleness, and the CPU each part of
the system used (cores); the busiest part names the bottleneck. Knobs:
ASEARCHER_BENCH_PRODUCERS (default "1,8,64,256,512"), ASEARCHER_BENCH_ETAS (default "0,1,4"),
ASEARCHER_BENCH_SECONDS (the measured window per point, default 75),
ASEARCHER_BENCH_STEP_MS (the trainer step's ms per trajectory before compression, default 50;
a small value takes the trainer out of the way to find the system's own limit),
ASEARCHER_BENCH_PER_PROCESS (concurrent trajectories per rollout process, default 128). Writes
results/scaling.json and results/scaling.png, or scaling-<ASEARCHER_BENCH_TAG>.* when set.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from pathlib import Path

import msgspec
import psutil
import pytest
from harness import show_table, write_results
from topology_runs import generation_idle, run_up, trainer_figures

from asearcher.producers.agents.timed_workflow import TimedWorkload
from asearcher.streams.cluster.local_broker import LocalBroker
from asearcher.streams.service.supervisor import RunSupervisor

PRODUCERS = [int(n) for n in os.environ.get("ASEARCHER_BENCH_PRODUCERS", "1,8,64,256,512")
             .split(",")]  # fmt: skip
ETAS = [int(e) for e in os.environ.get("ASEARCHER_BENCH_ETAS", "0,1,4").split(",")]
SECONDS = float(os.environ.get("ASEARCHER_BENCH_SECONDS", "75"))
WARMUP_S = 20.0  # after `stream up`: the trainer's first version, the producers' first groups
PER_PROCESS = int(os.environ.get("ASEARCHER_BENCH_PER_PROCESS", "128"))  # per rollout process
GROUP_SIZE = 4
# The modelled devices, with time compressed 5x so that a point fits in a minute: a GPU engine
# writes a sequence at about 50 tokens/s when it batches many (here 250), tools answer in about
# half a second with a tail (here 0.1 s), and the trainer steps and syncs the weights in 2 s
# plus 50 ms per trajectory of about 1,000 tokens (here 0.4 s and 10 ms): some 20k tokens/s of
# a 7B model's forward and backward passes on one node. Compression keeps every ratio between
# the devices; it multiplies the rate of events the system itself must carry by 5.
TIME_SCALE = 5.0
WORKLOAD = TimedWorkload(token_s=0.02 / TIME_SCALE, tool_median_s=0.5 / TIME_SCALE, seed=None)
STEP_MS = float(os.environ.get("ASEARCHER_BENCH_STEP_MS", "50"))
STEP_FIXED_S, STEP_PER_SAMPLE_S = 2.0 / TIME_SCALE, STEP_MS / 1000 / TIME_SCALE
TAG = os.environ.get("ASEARCHER_BENCH_TAG", "")
RESULTS = f"scaling-{TAG}" if TAG else "scaling"
RUN = """
name = "{name}"
[data]
world_entities = 60
dense = false
[rollout]
engine = "expert"
replicas = {replicas}
[rollout.config]
workflow = "timed"
concurrency = {concurrency}
status_every_s = 1
[trainer.config]
status_every_s = 1
keep_last = 2
[trainer.config.timed_step]
fixed_s = {fixed_s}
per_sample_s = {per_sample_s}
[trainer.config.batching]
groups_per_batch = {groups}
eta = {eta}
[feeder.config]
epochs = 0
group_size = {group_size}
outstanding = {outstanding}
[eval]
replicas = 0
[metrics]
enabled = false
"""


def run_config(name: str, producers: int, eta: int) -> str:
    replicas = math.ceil(producers / PER_PROCESS)
    groups = max(1, producers // GROUP_SIZE)  # a batch: one trajectory per producer
    return RUN.format(
        name=name, replicas=replicas, concurrency=math.ceil(producers / replicas), eta=eta,
        groups=groups, group_size=GROUP_SIZE, outstanding=max(8, 2 * groups),
        fixed_s=STEP_FIXED_S, per_sample_s=STEP_PER_SAMPLE_S,
    )  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and its descendants so far (0 for a process that is gone)."""
    try:
        process = psutil.Process(pid)
        total = 0.0
        for p in [process, *process.children(recursive=True)]:
            times = p.cpu_times()
            total += times.user + times.system
        return total
    except psutil.Error:
        return 0.0


def parts(supervisor: RunSupervisor, broker_pid: int) -> dict[str, list[int]]:
    """The system's parts and their pids: the broker and each service kind."""
    found = {"broker": [broker_pid]}
    for p in supervisor.processes():
        found.setdefault(p.name.split("-")[0], []).append(p.pid)
    return found


def cpu_by_part(pids: dict[str, list[int]]) -> dict[str, float]:
    return {part: sum(cpu_seconds(pid) for pid in ps) for part, ps in pids.items()}


def measure(settings, codec, home: Path, broker: LocalBroker, producers: int, eta: int) -> dict:
    """One point: the run up, the CPU of its parts over the window, its figures."""
    name = f"scale{producers}e{eta}-{uuid.uuid4().hex[:6]}"
    config = run_config(name, producers, eta)
    with run_up(home, broker.bootstrap_servers, name, config, WORKLOAD):
        time.sleep(WARMUP_S)
        pids = parts(RunSupervisor(home / "runs" / name), broker.pid() or 0)
        before, started = cpu_by_part(pids), time.monotonic()
        time.sleep(SECONDS)
        after, elapsed = cpu_by_part(pids), time.monotonic() - started
    cores = {part: (after[part] - before[part]) / elapsed for part in pids}
    return {
        "producers": producers, "eta": eta, "rollout_processes": len(pids.get("rollout", [])),
        **trainer_figures(settings, codec, name, least_steps=2),
        "generation_idle": generation_idle(settings, codec, name),
        "cores": cores, "cores_total": sum(cores.values()),
        "busiest": max(cores, key=cores.get),
    }  # fmt: skip


def plot(results: list[dict], out: Path) -> Path:
    """Throughput and trainer idle per mode against producers, and the cores each part of
    the system used in the most asynchronous mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    etas = sorted({r["eta"] for r in results})
    for eta in etas:
        mine = sorted((r for r in results if r["eta"] == eta), key=lambda r: r["producers"])
        label = {0: "η=0 (sync)", 1: "η=1 (one-step-off)"}.get(eta, f"η={eta} (async)")
        xs = [r["producers"] for r in mine]
        axes[0].plot(xs, [r["samples_per_s"] for r in mine], marker="o", label=label)
        axes[1].plot(xs, [100 * r["trainer_idle"] for r in mine], marker="o", label=label)
    axes[0].set_yscale("log")
    axes[0].legend()
    widest = sorted((r for r in results if r["eta"] == etas[-1]), key=lambda r: r["producers"])
    for part in sorted({part for r in widest for part in r["cores"]}):
        cores = [r["cores"].get(part, 0.0) for r in widest]
        axes[2].plot([r["producers"] for r in widest], cores, marker="o", label=part)
    axes[2].legend(fontsize=8)
    ylabels = ("trajectories trained / s", "trainer idle %", f"cores used at η={etas[-1]}")
    for axis, ylabel in zip(axes, ylabels, strict=True):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("producers (concurrent trajectories)")
        axis.set_ylabel(ylabel)
        axis.grid(alpha=0.3)
    figure.suptitle("timed generation and timed trainer step: the system's own cost on 2 cores")
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


@pytest.mark.benchmark
@pytest.mark.timeout(14400)
def test_throughput_against_producers_per_mode(broker, settings, codec, tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert broker.pid() is not None, "the session's broker has no pid"
    results = [measure(settings, codec, home, broker, producers, eta)
               for producers in PRODUCERS for eta in ETAS]  # fmt: skip
    sync = {r["producers"]: r["samples_per_s"] for r in results if r["eta"] == 0}
    rows = [[r["producers"], r["eta"], r["steps"], f"{r['samples_per_s']:.2f}",
             f"{r['samples_per_s'] / sync[r['producers']]:.2f}x" if r["producers"] in sync else "-",
             f"{100 * r['trainer_idle']:.0f}%", f"{100 * r['generation_idle']:.0f}%",
             f"{r['staleness_mean']:.2f}",
             " ".join(f"{k} {v:.2f}" for k, v in sorted(r["cores"].items())),
             r["busiest"]] for r in results]  # fmt: skip
    show_table(
        f"throughput vs producers, {SECONDS:g} s per point (timed generation and trainer step)",
        ["producers", "eta", "steps", "trajectories/s", "vs sync", "trainer idle",
         "generation idle", "staleness", "cores used", "busiest"],
        rows,
    )  # fmt: skip
    figure = plot(results, Path(__file__).parent / "results" / f"{RESULTS}.png")
    write_results(RESULTS, {
        "seconds_per_point": SECONDS, "time_scale": TIME_SCALE,
        "workload": msgspec.to_builtins(WORKLOAD),
        "step": {"fixed_s": STEP_FIXED_S, "per_sample_s": STEP_PER_SAMPLE_S},
        "per_process": PER_PROCESS, "points": results, "figure": figure.name,
    })  # fmt: skip
