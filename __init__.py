"""asearcher: event-sourced, fully asynchronous RL for LLM search agents on Apache Kafka.

The repository root is this import package; its folders are the sub-packages
`asearcher.streams`, `asearcher.producers`, `asearcher.consumers`, `asearcher.trainer`,
`asearcher.cli` and `asearcher.infra`.
"""

__version__ = "0.1.0"
