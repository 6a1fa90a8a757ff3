"""How far clones of the same demonstrations differ by the order they are cloned in, and
whether the warm start's selection questions rank the orders as the run's evaluation does.

The learning run's warm start clones the scripted expert's demonstrations with one shuffle
seed, starting from the order in which they reached Kafka; that order changes from run to run.
This benchmark clones the same demonstrations (those of run `learn` on `expert.trajectories`,
as the warm start does, with its epochs, batch and rate) once per shuffle seed and plays each
clone in this process twice over: on the held-out questions of the demonstration worlds (what
`warm_start.orders` > 1 chooses by, `cli/run/clone_selection.py`, one play each) and on every
held-out question of the run's world x 2 (what the run's evaluation scores), each beside its
standard error, then the correlation of the two across orders. Clones that differ by more than
the error are what a "best of several orders" warm start can choose between; the correlation
says whether it chooses well. `ASEARCHER_BENCH_SCHEDULES=constant,decay` clones every order
twice, side by side: at the warm start's constant rate and with `warm_start.lr_decay` (the
rate warmed up, then decayed linearly to 0), to measure whether the schedule narrows the spread.

It needs a home where `asearcher learn` has run (the worlds, the policy and the demonstrations
on its broker's topic): `ASEARCHER_BENCH_HOME=<home> ASEARCHER_BENCH_ORDERS=0,1,2,3
.venv/bin/python -m pytest tests/benchmarks/bench_clone_orders.py -m benchmark -s`
(about 4 minutes an order and schedule on 2 cores). `ASEARCHER_BENCH_EPOCHS=4` clones for
that many epochs instead of the warm start's. Results: results/clone-orders.json
(results/clone-orders-schedules.json with both schedules, `-epochs4` and `-snapshots` added).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from harness import show_table, write_results

from tests.support.runs import ASEARCHER

ORDERS = [int(s) for s in os.environ.get("ASEARCHER_BENCH_ORDERS", "0,1,2,3").split(",")]
SCHEDULES = os.environ.get("ASEARCHER_BENCH_SCHEDULES", "constant").split(",")
# Steps after which a clone is also scored (the last step always is): whether one cloning run
# holds snapshots as far apart as different orders' clones are.
SNAPSHOTS = {int(s) for s in os.environ.get("ASEARCHER_BENCH_SNAPSHOTS", "").split(",") if s}
# Cloning epochs instead of the warm start's (with SNAPSHOTS at the shorter run's last step,
# both lengths are scored from one run: the shuffle and a constant rate make its start the same).
EPOCHS = int(os.environ.get("ASEARCHER_BENCH_EPOCHS", "0"))
HOME = os.environ.get("ASEARCHER_BENCH_HOME", "")
SAMPLES = 2
RUN = "learn"


@pytest.mark.benchmark
@pytest.mark.timeout(len(ORDERS) * len(SCHEDULES) * 600 + 300)
def test_clone_orders(tmp_path: Path) -> None:
    from asearcher.cli.jobs.evaluation import benchmark_questions
    from asearcher.cli.run.clone_selection import (
        CloneScorer,
        f1_per_question,
        mean_and_error,
    )
    from asearcher.cli.run.config import paths, resolve
    from asearcher.cli.run.warm_start import cloning_config
    from asearcher.cli.wiring import chosen_run_config
    from asearcher.consumers.tools.toolbox import Toolbox, build_backends
    from asearcher.producers.rollout.tool_router import InProcessToolClient
    from asearcher.streams.cluster.settings import KafkaSettings, local_bootstrap
    from asearcher.streams.wire.codec import EventCodec
    from asearcher.trainer.runtime.weight_publisher import WeightStore
    from asearcher.trainer.sft.sft_job import SftJob

    assert HOME, "set ASEARCHER_BENCH_HOME to a home where `asearcher learn` has run"
    home = Path(HOME)
    subprocess.run([ASEARCHER, "stream", "up", "--broker-only", "--home", HOME], check=True)
    config = chosen_run_config(None, RUN, home)
    where = paths(config, home)
    resolved = resolve(config, where)
    settings = KafkaSettings(bootstrap_servers=local_bootstrap(home))
    questions = benchmark_questions("world", None, "test", where.world_dir, None)
    run_tools = InProcessToolClient(Toolbox(*build_backends(resolved.tools), resolved.tools))
    scorer = CloneScorer(config, resolved, where)
    rows = []
    for schedule, order in [(s, o) for s in SCHEDULES for o in ORDERS]:
        assert schedule in ("constant", "decay"), f"unknown schedule {schedule!r}"
        started = time.monotonic()
        # Never published: a store of its own only satisfies the job's check for newer versions.
        store = WeightStore((tmp_path / f"{schedule}-{order}").as_uri())
        sft = cloning_config(config, model=f"{schedule}{order}", seed=order)
        sft = msgspec.structs.replace(
            sft, lr_decay=schedule == "decay", epochs=EPOCHS or sft.epochs
        )
        job = SftJob(settings, EventCodec(), sft, where.model_dir, store)
        data = job.data()
        results = job.train(data, keep_at={*SNAPSHOTS, job.steps(data)})
        trained_s = time.monotonic() - started
        for step, weights in sorted(job.snapshots.items()):
            started = time.monotonic()
            chosen_by = scorer.score(order, weights)
            # The scorer's policy now holds this clone: the run's evaluation questions, x SAMPLES.
            run = asyncio.run(f1_per_question(scorer.policy, run_tools, resolved.evaluator.agent,
                                              questions, scorer.sampling, SAMPLES))  # fmt: skip
            f1, error = mean_and_error(run)
            rows.append({
                "schedule": schedule, "order": order, "step": step, "last": step == len(results),
                "f1": f1, "standard_error": error, "per_question": run,
                "selection_f1": chosen_by.f1,
                "selection_standard_error": chosen_by.standard_error,
                "steps": len(results), "loss_first": results[0].stats.loss,
                "loss_last": results[step - 1].stats.loss,
                "seconds": trained_s + time.monotonic() - started,
            })  # fmt: skip
    scorer.close()
    show_table(
        f"clones of run {RUN!r}'s demonstrations by shuffle order: F1 on the demonstration "
        f"worlds' held-out questions ({scorer.questions} q x 1) and on the run's ("
        f"{len(questions)} q x {SAMPLES})",
        ["schedule", "order", "step", "selection F1", "run's held-out F1", "loss first -> then",
         "seconds"],
        [[r["schedule"], r["order"], f"{r['step']}/{r['steps']}",
          f"{r['selection_f1']:.3f} ±{r['selection_standard_error'] * 100:.1f}",
          f"{r['f1']:.3f} ±{r['standard_error'] * 100:.1f}",
          f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}", f"{r['seconds']:.0f}"]
         for r in rows],
    )  # fmt: skip
    summaries = {schedule: _summary([r for r in rows if r["schedule"] == schedule and r["last"]])
                 for schedule in SCHEDULES}  # fmt: skip
    if SNAPSHOTS:
        summaries["snapshots"] = _summary(_best_snapshots(rows))
    for schedule, summary in summaries.items():
        print(f"{schedule}: {summary['line']}")
    name = "clone-orders" if SCHEDULES == ["constant"] else "clone-orders-schedules"
    name += f"-epochs{EPOCHS}" if EPOCHS else ""
    write_results(f"{name}-snapshots" if SNAPSHOTS else name, {
        "home": HOME, "samples": SAMPLES, "selection_questions": scorer.questions,
        "schedules": summaries, "orders": rows,
    })  # fmt: skip
    assert all(r["steps"] for r in rows)


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How far one schedule's clones spread and whether the selection ranks them as the run."""
    f1 = [float(r["f1"]) for r in rows]
    chosen = [float(r["selection_f1"]) for r in rows]
    spread = statistics.stdev(f1) if len(f1) > 1 else 0.0
    agree = statistics.correlation(chosen, f1) if len(f1) > 2 else None
    best = max(rows, key=lambda r: r["selection_f1"])
    line = (
        f"orders: run's F1 {min(f1):.3f}-{max(f1):.3f}, sd {spread * 100:.1f} points; selection "
        f"F1 {min(chosen):.3f}-{max(chosen):.3f}; correlation of selection and run F1: {agree}; "
        f"the selection would pick order {best['order']} (run's F1 {best['f1']:.3f}, mean of "
        f"all {statistics.mean(f1):.3f})"
    )
    return {"f1_sd": spread, "f1_mean": statistics.mean(f1), "f1_min": min(f1),
            "selection_min": min(chosen), "correlation": agree, "picked": best["order"],
            "line": line}  # fmt: skip


def _best_snapshots(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of each order and schedule, the snapshot its selection questions rate best."""
    runs = {(r["schedule"], r["order"]) for r in rows}
    return [max((r for r in rows if (r["schedule"], r["order"]) == run),
                key=lambda r: r["selection_f1"]) for run in sorted(runs)]  # fmt: skip
