"""The soak: `stream chaos` for an hour on the expert run, every service's memory sampled.

    .venv/bin/python -m pytest tests/benchmarks/bench_soak.py -m benchmark -s

The expert run of `tests/test_topology.py` (its feeder feeding forever) is brought up with its
own broker; once it trains, `stream chaos` kills a random service every 20 s on average for
`ASEARCHER_SOAK_SECONDS` (3,600 by default) and the broker twice, sampling the memory of every
service and of the broker, and the disk, every 30 s. The result (`results/soak.json`) holds the
whole chaos report: every fault with its recovery time, throughput before, during and after,
the memory and disk trends after the first 10 minutes, and the run's ledger.

`ASEARCHER_SOAK_FAULTS=0` runs the same run without faults (`results/soak-steady.json`; samples
every 15 s, trends after 5 minutes): every process then lives the whole run, which tells a
process that grows from samples of young processes restarted at different moments.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest
from harness import show_table, write_results

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.wire.codec import EventCodec
from tests.conftest import free_port_pair
from tests.support.runs import EXPERT_RUN, Run, versions
from tests.support.waiting import wait_for

SECONDS = float(os.environ.get("ASEARCHER_SOAK_SECONDS", "3600"))
FAULTS = os.environ.get("ASEARCHER_SOAK_FAULTS", "1") != "0"
# kills every 20 s on average and two broker restarts, or none (a mean of a billion seconds)
SCHEDULE = (
    ["--every", "20", "--broker-restarts", "2", "--baseline", "60", "--settle", "120",
     "--sample-every", "30", "--warmup", "600"]
    if FAULTS
    else ["--every", "1e9", "--broker-restarts", "0", "--baseline", "30", "--settle", "30",
          "--sample-every", "15", "--warmup", "300"]
)  # fmt: skip
SOAK_RUN = EXPERT_RUN.replace("[feeder.config]\n", "[feeder.config]\nepochs = 0\n", 1)


@pytest.mark.benchmark
@pytest.mark.timeout(int(SECONDS) + 3600)
def test_soak(tmp_path: Path) -> None:
    port = free_port_pair()
    run = Run(tmp_path / "home", None, SOAK_RUN)
    settings, codec = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}"), EventCodec()
    out = tmp_path / "soak.json"
    try:
        run.cli("stream", "up", "-c", str(run.config), "--port", str(port), timeout=900)
        wait_for("2 weight versions", lambda: len(versions(settings, codec, run.name)) >= 2, 600)
        printed = run.cli(
            "stream", "chaos", "--run", run.name, "--seconds", str(SECONDS), *SCHEDULE,
            "--seed", "1", "--out", str(out), check=False, timeout=SECONDS + 1800,
        )  # fmt: skip
        print(printed)
    finally:
        run.cli("stream", "down", check=False)
    report = json.loads(out.read_text())
    summary = summarize(report)
    name = "soak" if FAULTS else "soak-steady"
    write_results(name, {"seconds": SECONDS, "summary": summary, "report": report})
    ledger = report["ledger"]
    assert ledger["violations"] == [] and report["throughput"]["after"] > 0, summary


def summarize(report: dict) -> dict:
    """Recovery times per kind of target, throughput, and every trend: what the docs quote."""
    recoveries: dict[str, list[float]] = {}
    for fault in report["faults"]:
        kind = fault["target"].rsplit("-", 1)[0] if fault["target"][-1].isdigit() else \
            fault["target"]  # fmt: skip
        recoveries.setdefault(kind, []).append(fault["recovered_s"] or float("nan"))
    show_table(
        "Recovery after kill -9 (seconds)", ("target", "kills", "median", "max"),
        [(k, len(v), f"{statistics.median(v):.1f}", f"{max(v):.1f}")
         for k, v in sorted(recoveries.items())],
    )  # fmt: skip
    trends = report["resources"]["trends"]
    show_table(
        "Memory and disk after the warm-up (MB)",
        ("series", "first", "last", "peak", "per hour", "processes", "per hour within one",
         "floor per hour"),
        [(t["series"], t["first_mb"], t["last_mb"], t["peak_mb"], t["slope_mb_per_h"],
          t.get("processes", 0), t.get("within_process_mb_per_h", 0.0),
          "-" if t.get("floor_mb_per_h") is None else t["floor_mb_per_h"]) for t in trends],
    )  # fmt: skip
    return {
        "faults": len(report["faults"]),
        "recoveries": {
            k: {"kills": len(v), "median_s": statistics.median(v), "max_s": max(v)}
            for k, v in recoveries.items()
        },  # fmt: skip
        "throughput": report["throughput"],
        "versions_during": report["versions_during"],
        "unplanned_restarts": report["unplanned_restarts"],
        "violations": report["ledger"]["violations"],
        "trained": report["ledger"]["trained"],
        "trends": trends,
    }
