"""A request feeder in its own process, so a test can SIGKILL it with a batch in flight.

Usage: feeder_process.py CONFIG_JSON  (a FeederConfig encoded as JSON)
Prints `serving` once it has read its position, and a summary line when it stops.
"""

from __future__ import annotations

import sys

import msgspec

from asearcher.producers.rollout.feeder import FeederConfig, FeederService
from asearcher.streams.cluster.settings import kafka_settings
from asearcher.streams.wire.codec import EventCodec


def main(config_json: str) -> None:
    config = msgspec.json.decode(config_json, type=FeederConfig)
    service = FeederService(kafka_settings(), EventCodec(), config)
    print("serving", flush=True)
    stats = service.run(exit_when_done=True)
    service.close()
    print(f"stopped: {stats.line()}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
