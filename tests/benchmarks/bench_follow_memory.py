"""Memory of following a topic of large events from its beginning: decoding values or reading keys.

The feeder counts finished groups by following `trajectories` from the beginning on every start.
Decoding each record (`TopicTail`) turns batches of up to 500 trajectories into Python objects at
once; their peak stays in the process. Its keys say all it needs (the group id), so it reads
only those (`KeyTail`). What librdkafka fetches ahead of a slow reader is held too: the keys-only
follower is measured with librdkafka's prefetch (64 MB queued) and with the followers' bound
(`tail.PREFETCH_KB`). Each follower runs in a fresh process, alternating over rounds, on the
same topic; the table gives the median over the rounds of the resident memory it added, its peak
above where it started and how long it took to catch up.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import show_table, write_results

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.tail import PREFETCH_KB, KeyTail, TopicTail
from asearcher.streams.service.memory import resident_mb
from asearcher.streams.wire.codec import EventCodec
from tests.support import samples

pytestmark = pytest.mark.benchmark

TRAJECTORIES = int(os.environ.get("ASEARCHER_FOLLOW_TRAJECTORIES", "3000"))
# Each record's handling waits this long: a follower in a process that shares the CPU (a feeder
# restarted under chaos) drains its queue slower than librdkafka fills it.
HANDLE_S = float(os.environ.get("ASEARCHER_FOLLOW_HANDLE_S", "0.0005"))
TOKENS = 2048
GROUP_SIZE = 8
ROUNDS = 3
FOLLOWERS = (
    "decoding values (TopicTail)",
    "keys only, librdkafka's prefetch",
    f"keys only (KeyTail, prefetch {PREFETCH_KB // 1024} MB)",
    "the same, MALLOC_ARENA_MAX=2",
)
# glibc gives each thread that allocates its own malloc arena; memory freed in one is kept for
# it. librdkafka's threads allocate the fetched records: the cap shows what those arenas hold.
ALLOCATOR_ENV = {FOLLOWERS[3]: {"MALLOC_ARENA_MAX": "2"}}
REPO = Path(__file__).resolve().parents[2]


def follow(servers: str, topic: str, follower: str) -> dict[str, float]:
    """Follow `topic` from its beginning to its end in this process; what it cost."""
    settings, codec = KafkaSettings(bootstrap_servers=servers), EventCodec()
    groups: set[str] = set()

    def note(group: str) -> None:
        time.sleep(HANDLE_S)
        groups.add(group)

    before, started = resident_mb(), time.monotonic()
    tail: TopicTail | KeyTail
    if follower == FOLLOWERS[0]:
        letters = EventProducer(settings, codec)
        tail = TopicTail(settings, codec, topic, lambda r: note(r.event.group_id), letters,
                         "beginning")  # fmt: skip
    else:
        prefetch = None if follower == FOLLOWERS[1] else PREFETCH_KB
        tail = KeyTail(settings, topic, lambda key, _kind: note(key), "beginning", prefetch)
    tail.start()
    if not tail.caught_up.wait(600):
        raise TimeoutError(f"{follower} did not catch up in 600 s")
    seconds = time.monotonic() - started
    tail.stop()
    return {
        "groups": len(groups), "seconds": seconds, "added_mb": resident_mb() - before,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before,
    }  # fmt: skip


def measure(servers: str, topic: str, follower: str) -> dict[str, float]:
    """`follow` in a fresh interpreter, so that no follower inherits another's memory."""
    done = subprocess.run(
        [sys.executable, __file__, servers, topic, follower],
        capture_output=True, text=True, check=True, cwd=REPO,
        env={**os.environ, **ALLOCATOR_ENV.get(follower, {}), "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])},
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_following_by_keys_against_decoding(settings, make_topic) -> None:
    topic = make_topic(like="trajectories", partitions=4)
    rng = random.Random(0)
    with EventProducer(settings, EventCodec()) as producer:
        for index in range(TRAJECTORIES):
            group = f"bench-e0-{index // GROUP_SIZE:06d}"
            event = samples.trajectory(rng, TOKENS, group_id=group, group_size=GROUP_SIZE)
            producer.send(topic, event)
    runs: dict[str, list[dict[str, float]]] = {f: [] for f in FOLLOWERS}
    for _ in range(ROUNDS):
        for follower in FOLLOWERS:
            runs[follower].append(measure(settings.bootstrap_servers, topic, follower))
    groups = TRAJECTORIES // GROUP_SIZE
    assert all(run["groups"] == groups for each in runs.values() for run in each)
    summary = {
        follower: {k: statistics.median(r[k] for r in each) for k in ("seconds", "added_mb",
                                                                      "peak_mb")}
        for follower, each in runs.items()
    }  # fmt: skip
    show_table(
        f"Following {TRAJECTORIES} trajectories of {TOKENS} tokens from the beginning, "
        f"{HANDLE_S * 1e3:g} ms a record (median of {ROUNDS} fresh processes each)",
        ["follower", "seconds", "memory added (MB)", "peak added (MB)"],
        [[f, f"{s['seconds']:.2f}", f"{s['added_mb']:.0f}", f"{s['peak_mb']:.0f}"]
         for f, s in summary.items()],
    )  # fmt: skip
    # The default size keeps the documented file; other sizes sit beside it.
    name = "follow-memory" if TRAJECTORIES == 3000 else f"follow-memory-{TRAJECTORIES}"
    write_results(name, {
        "trajectories": TRAJECTORIES, "tokens": TOKENS, "group_size": GROUP_SIZE,
        "handle_s": HANDLE_S, "prefetch_kb": PREFETCH_KB,
        "rounds": ROUNDS, "followers": summary, "runs": runs,
    })  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(follow(*sys.argv[1:4])))
