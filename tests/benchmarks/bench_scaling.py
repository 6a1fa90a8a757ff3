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
generation idle fraction, staleness, the rollout events per second, and the CPU each part of
the system used (cores); the busiest part names the bottleneck. Knobs:
ASEARCHER_BENCH_PRODUCERS (default "1,8,64,256,512"), ASEARCHER_BENCH_ETAS (default "0,1,4"),
ASEARCHER_BENCH_SECONDS (the measured window per point, default 75). Writes
results/scaling.json and results/scaling.png.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import psutil
import pytest
from harness import show_table, write_results

from asearcher.producers.timed_workflow import ENV_WORKLOAD, TimedWorkload
from asearcher.streams.events import ServiceStatus, TrainerStepFinished
from asearcher.streams.supervisor import RunSupervisor
from asearcher.streams.topics import SERVICE_STATUS, TRAINER_METRICS
from tests.rollout_support import events_of

ASEARCHER = str(Path(sys.executable).parent / "asearcher")
PRODUCERS = [int(n) for n in os.environ.get("ASEARCHER_BENCH_PRODUCERS", "1,8,64,256,512")
             .split(",")]  # fmt: skip
ETAS = [int(e) for e in os.environ.get("ASEARCHER_BENCH_ETAS", "0,1,4").split(",")]
SECONDS = float(os.environ.get("ASEARCHER_BENCH_SECONDS", "75"))
WARMUP_S = 20.0  # after `stream up`: the trainer's first version, the producers' first groups
PER_PROCESS = 128  # concurrent trajectories per rollout process
GROUP_SIZE = 4
# The modelled devices, with time compressed 5x so that a point fits in a minute: a GPU engine
# writes a sequence at about 50 tokens/s when it batches many (here 250), tools answer in about
# half a second with a tail (here 0.1 s), and the trainer steps and syncs the weights in 2 s
# plus 50 ms per trajectory of about 1,000 tokens (here 0.4 s and 10 ms): some 20k tokens/s of
# a 7B model's forward and backward passes on one node. Compression keeps every ratio between
# the devices; it multiplies the rate of events the system itself must carry by 5.
TIME_SCALE = 5.0
WORKLOAD = TimedWorkload(token_s=0.02 / TIME_SCALE, tool_median_s=0.5 / TIME_SCALE, seed=None)
STEP_FIXED_S, STEP_PER_SAMPLE_S = 2.0 / TIME_SCALE, 0.05 / TIME_SCALE
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


def play(home: Path, bootstrap: str, broker_pid: int, producers: int, eta: int) -> dict:
    """One point: bring the run up, measure CPU over the window, bring it down."""
    name = f"scale{producers}e{eta}-{uuid.uuid4().hex[:6]}"
    config = home / f"{name}.toml"
    config.write_text(run_config(name, producers, eta))
    env = {**os.environ, "ASEARCHER_HOME": str(home), "ASEARCHER_BOOTSTRAP_SERVERS": bootstrap,
           ENV_WORKLOAD: msgspec.json.encode(WORKLOAD).decode()}  # fmt: skip
    up = subprocess.run([ASEARCHER, "stream", "up", "-c", str(config)], env=env, cwd="/",
                        capture_output=True, text=True, timeout=600)  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    time.sleep(WARMUP_S)
    pids = parts(RunSupervisor(home / "runs" / name), broker_pid)
    before, started = cpu_by_part(pids), time.monotonic()
    time.sleep(SECONDS)
    after, elapsed = cpu_by_part(pids), time.monotonic() - started
    subprocess.run([ASEARCHER, "stream", "down", "--keep-broker"], env=env, cwd="/",
                   capture_output=True, text=True, timeout=600)  # fmt: skip
    cores = {part: (after[part] - before[part]) / elapsed for part in pids}
    return {"name": name, "producers": producers, "eta": eta, "cores": cores,
            "rollout_processes": len(pids.get("rollout", []))}  # fmt: skip


def measure(settings, codec, point: dict) -> dict:
    """Throughput, idle fractions and staleness of one point, from its events."""
    name = point["name"]
    steps = sorted(
        (e for e in events_of(settings, codec, TRAINER_METRICS)
         if isinstance(e, TrainerStepFinished) and e.model == name),
        key=lambda e: e.created_at,
    )  # fmt: skip
    assert len(steps) >= 2, f"only {len(steps)} steps for {name}"
    window = steps[-1].created_at - steps[0].created_at
    trained = sum(s.samples for s in steps[1:])
    ages = [k for s in steps for k, n in enumerate(s.staleness_counts) for _ in range(n)]
    rollout = f"{name}-rollout-"
    beats = [e for e in events_of(settings, codec, SERVICE_STATUS)
             if isinstance(e, ServiceStatus) and e.instance.startswith(rollout)]  # fmt: skip
    last = {}
    for beat in sorted(beats, key=lambda b: b.created_at):
        last[beat.instance] = beat.counters
    lifetime = sum(c["trajectories"] / c["trajectories_per_s"] for c in last.values()
                   if c["trajectories_per_s"])  # fmt: skip
    busiest = max(point["cores"], key=point["cores"].get)
    return {
        **point,
        "steps": len(steps),
        "samples_per_s": trained / window,
        "trainer_idle": sum(s.idle_fraction for s in steps[1:]) / (len(steps) - 1),
        "generation_idle": sum(c["staleness_wait_s"] for c in last.values()) / max(lifetime, 1e-9),
        "staleness_mean": sum(ages) / max(len(ages), 1),
        "staleness_max": max(ages, default=0),
        "window_s": window,
        "busiest": busiest,
        "cores_total": sum(point["cores"].values()),
    }


def plot(results: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for eta in sorted({r["eta"] for r in results}):
        mine = sorted((r for r in results if r["eta"] == eta), key=lambda r: r["producers"])
        label = {0: "η=0 (sync)", 1: "η=1 (one-step-off)"}.get(eta, f"η={eta} (async)")
        xs = [r["producers"] for r in mine]
        axes[0].plot(xs, [r["samples_per_s"] for r in mine], marker="o", label=label)
        axes[1].plot(xs, [100 * r["trainer_idle"] for r in mine], marker="o", label=label)
    for axis, ylabel in zip(axes, ("trajectories trained / s", "trainer idle %"), strict=True):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("producers (concurrent trajectories)")
        axis.set_ylabel(ylabel)
        axis.grid(alpha=0.3)
    axes[0].legend()
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
    broker_pid = broker.pid()
    assert broker_pid is not None, "the session's broker has no pid"
    results = []
    for producers in PRODUCERS:
        for eta in ETAS:
            point = play(home, broker.bootstrap_servers, broker_pid, producers, eta)
            results.append(measure(settings, codec, point))
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
    figure = plot(results, Path(__file__).parent / "results" / "scaling.png")
    write_results("scaling", {
        "seconds_per_point": SECONDS, "time_scale": TIME_SCALE,
        "workload": msgspec.to_builtins(WORKLOAD),
        "step": {"fixed_s": STEP_FIXED_S, "per_sample_s": STEP_PER_SAMPLE_S},
        "per_process": PER_PROCESS, "points": results, "figure": figure.name,
    })  # fmt: skip
