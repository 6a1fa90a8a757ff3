"""The local broker's process: what `stream up` starts when no cluster is named."""

import psutil
import pytest

from asearcher.streams.cluster.local_broker import LocalBroker
from tests.conftest import free_port_pair

MIB = 1024 * 1024


@pytest.mark.kafka  # starts a broker of its own
def test_a_fresh_broker_holds_its_whole_heap_so_its_memory_is_flat_from_the_start(
    tmp_path,
) -> None:
    broker = LocalBroker(tmp_path / "home", port=free_port_pair(), heap_mb=1024)
    broker.up()
    try:
        pid = broker.pid()
        assert pid is not None
        # Untouched, a fresh JVM holds a fraction of its heap and grows into it for half an hour.
        resident = psutil.Process(pid).memory_info().rss
        assert resident >= broker.heap_mb * MIB, f"{resident / MIB:.0f} MB resident"
    finally:
        broker.down(purge=True)
