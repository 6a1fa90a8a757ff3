"""A rollout producer in its own process with a scripted engine, so a test can SIGKILL it.

Usage: rollout_producer.py REQUESTS TRAJECTORIES STEPS GROUP INSTANCE DELAY_S
Each turn takes DELAY_S seconds: a search (nobody answers it, so it times out), then the answer.
"""

from __future__ import annotations

import logging
import os
import sys

from asearcher.producers.agents.agent import AgentConfig
from asearcher.producers.engines.base import ScriptedEngine
from asearcher.producers.rollout.service import RolloutConfig, RolloutService, RolloutTopics
from asearcher.streams.cluster.settings import kafka_settings
from asearcher.streams.service.log import ROOT, configure_logging
from asearcher.streams.wire.codec import EventCodec


def script(prompt: str) -> str:
    if "timed out" in prompt:
        return "<think>sure</think><answer>yes</answer>"
    return "<think>look</think><search>question</search>"


def main(requests, trajectories, steps, group, instance, delay) -> None:
    configure_logging()  # on stderr, which the test shows when it fails
    name = f"{instance}-{os.getpid()}"  # the test starts several; say which one speaks
    for handler in logging.getLogger(ROOT).handlers:
        handler.addFilter(lambda record: setattr(record, "msg", f"[{name}] {record.msg}") or True)
    engine = ScriptedEngine(script, delay_s=float(delay))
    topics = RolloutTopics(requests=requests, trajectories=trajectories, steps=steps)
    config = RolloutConfig(
        topics=topics, group_id=group, instance=instance, concurrency=4,
        agent=AgentConfig(tool_timeout_s=0.3),
    )  # fmt: skip
    service = RolloutService(
        kafka_settings(), EventCodec(), engine, config,
        **{"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )  # fmt: skip
    print("serving", flush=True)
    stats = service.run()
    service.close()
    print(f"stopped after {stats.groups} groups", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
