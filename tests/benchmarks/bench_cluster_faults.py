"""Broker faults on a three-node cluster: the time from each fault to the run's next step.

    .venv/bin/python -m pytest tests/benchmarks/bench_cluster_faults.py -m benchmark -s

The expert run of `tests/test_topology.py` (its feeder feeding forever) is brought up on a
local cluster of three KRaft nodes (`stream up --brokers 3`). Once it trains, `stream chaos`
watches it for a minute, then over `ASEARCHER_CLUSTER_SECONDS` (360 by default) kills -9 the
node leading most partitions of `trajectories` twice (each down 20 s), restarts every node in
turn once, and kills -9 the whole cluster once, with no service killed. Each fault's recovery
(the node back and every partition in sync; the whole cluster answering again) and the time to
the run's next trained step are recorded, with trajectories trained per minute before, during
and after the faults, and the run's ledger (`results/cluster_faults.json`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from harness import show_table, write_results

from asearcher.streams.cluster.local_broker import LocalBroker
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.wire.codec import EventCodec
from tests.conftest import free_port_pair
from tests.support.runs import EXPERT_RUN, Run, versions
from tests.support.waiting import wait_for

NODES = 3
SECONDS = float(os.environ.get("ASEARCHER_CLUSTER_SECONDS", "360"))
SCHEDULE = ["--every", "1e9", "--leader-kills", "2", "--node-down", "20", "--rolling-restarts",
            "1", "--broker-restarts", "1", "--baseline", "60", "--settle", "60",
            "--sample-every", "15", "--warmup", "60"]  # fmt: skip
FOREVER_RUN = EXPERT_RUN.replace("[feeder.config]\n", "[feeder.config]\nepochs = 0\n", 1)


@pytest.mark.benchmark
@pytest.mark.timeout(int(SECONDS) + 2400)
def test_cluster_faults(tmp_path: Path) -> None:
    port = free_port_pair(2 * NODES)
    run = Run(tmp_path / "home", None, FOREVER_RUN)
    bootstrap = LocalBroker(tmp_path / "addresses", port=port, brokers=NODES).bootstrap_servers
    settings, codec = KafkaSettings(bootstrap_servers=bootstrap), EventCodec()
    out = tmp_path / "cluster_faults.json"
    try:
        run.cli("stream", "up", "-c", str(run.config), "--port", str(port), "--brokers",
                str(NODES), timeout=900)  # fmt: skip
        wait_for("2 weight versions", lambda: len(versions(settings, codec, run.name)) >= 2, 600)
        printed = run.cli(
            "stream", "chaos", "--run", run.name, "--seconds", str(SECONDS), *SCHEDULE,
            "--seed", "1", "--out", str(out), check=False, timeout=SECONDS + 1800,
        )  # fmt: skip
        print(printed)
    finally:
        run.cli("stream", "down", check=False)
    report = json.loads(out.read_text())
    faults = [
        {key: fault[key] for key in ("target", "at_s", "recovered_s", "next_step_s")}
        for fault in report["faults"]
    ]
    show_table(
        "Broker faults on three nodes (seconds)", ("fault", "at", "back after", "next step after"),
        [(f["target"], f["at_s"], f["recovered_s"], f["next_step_s"]) for f in faults],
    )  # fmt: skip
    rate = report["throughput"]
    phases = ("before", "during", "after")
    show_table("Trajectories trained per minute", phases, [[f"{rate[p]:.1f}" for p in phases]])
    ledger = report["ledger"]
    write_results(
        "cluster_faults",
        {"seconds": SECONDS, "nodes": NODES, "faults": faults, "throughput": rate,
         "versions_during": report["versions_during"],
         "unplanned_restarts": report["unplanned_restarts"],
         "violations": ledger["violations"], "trained": ledger["trained"], "report": report},
    )  # fmt: skip
    assert ledger["violations"] == [] and all(f["next_step_s"] is not None for f in faults)
