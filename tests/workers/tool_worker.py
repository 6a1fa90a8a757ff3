"""A tool worker in its own process, so a test can SIGKILL it mid-call.

Usage: tool_worker.py CALLS_TOPIC RESULTS_TOPIC GROUP INDEX_DIR RESULTS_URL NAME SEARCH
SEARCH is `local` or a plugin such as `tests.workers.slow_search:SlowSearch`.
"""

from __future__ import annotations

import sys

from asearcher.consumers.tools.result_store import ResultStore
from asearcher.consumers.tools.tool_worker import ToolWorker
from asearcher.consumers.tools.toolbox import Toolbox, build_backends, load_tool_config
from asearcher.streams.cluster.settings import kafka_settings
from asearcher.streams.wire.codec import EventCodec


def main(calls, results, group, index_dir, results_url, name, search) -> None:
    config = load_tool_config(None, index_dir=index_dir, search=search, max_concurrency=4)
    worker = ToolWorker(
        kafka_settings(), EventCodec(), Toolbox(*build_backends(config), config),
        ResultStore(results_url), group_id=group, calls_topic=calls, results_topic=results,
        name=name, **{"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )  # fmt: skip
    print("serving", flush=True)
    stats = worker.run()
    worker.close()
    print(f"stopped after {stats.handled} calls", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
