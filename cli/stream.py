"""`asearcher stream ...`: the event log itself (local broker, topics, status)."""

from __future__ import annotations

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.options import BootstrapServers, Home, KafkaConfig, cluster

app = typer.Typer(help="Run and inspect the event log: the local Kafka broker and the topics.")
console = Console()


def _local_broker(home: str | None, port: int | None = None):
    from asearcher.streams.local_broker import LocalBroker
    from asearcher.streams.settings import state_dir

    return LocalBroker(state_dir(home), port=port)


@app.command()
def up(
    port: int = typer.Option(9092, help="Port of the local broker (the controller uses port+1)."),
    bootstrap: BootstrapServers = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
) -> None:
    """Start the local Kafka broker if needed, then create every declared topic.

    With --bootstrap-servers no broker is started: the topics are created on that cluster.
    Running it again is harmless: it says the broker is already up.
    """
    from asearcher.streams.admin import ensure_topics

    settings = cluster(bootstrap, kafka_config, home)
    if not settings.external:
        broker = _local_broker(home, port)
        with console.status("starting the local Kafka broker (the first run fetches its jars)"):
            started = broker.up()
        state = "started" if started else "already up"
        console.print(f"local Kafka {state} at {broker.bootstrap_servers} (state in {broker.dir})")
        settings = cluster(bootstrap, kafka_config, home)
    created = ensure_topics(settings)
    if created:
        console.print(f"created topics: {', '.join(created)}")
    else:
        console.print("all topics exist")


@app.command()
def down(
    purge: bool = typer.Option(False, "--purge", help="Also delete the broker's data and logs."),
    home: Home = None,
) -> None:
    """Stop the local Kafka broker cleanly; its data stays unless --purge."""
    broker = _local_broker(home)
    was_running = broker.down(purge=purge)
    console.print("local Kafka stopped" if was_running else "local Kafka was not running")
    if purge:
        console.print(f"deleted {broker.dir}")


@app.command()
def status(
    bootstrap: BootstrapServers = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
) -> None:
    """Show the broker, every topic with partitions and message counts, and consumer-group lag."""
    from asearcher.cli.render import status_tables
    from asearcher.streams.admin import cluster_status

    settings = cluster(bootstrap, kafka_config, home)
    if not settings.external and not _local_broker(home).is_running():
        raise CliError("the local broker is not running: start it with `asearcher stream up`")
    for table in status_tables(cluster_status(settings)):
        console.print(table)


@app.command()
def install() -> None:
    """Fetch the pinned Apache Kafka jars from Maven Central into the user cache (once)."""
    from asearcher.streams.local_broker import KAFKA_VERSION, install_kafka

    with console.status(f"fetching Apache Kafka {KAFKA_VERSION} with Maven"):
        libs = install_kafka()
    console.print(f"Apache Kafka {KAFKA_VERSION} jars in {libs}")
