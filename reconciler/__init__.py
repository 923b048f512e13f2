"""stream-reconciler: a declarative reconciler for exactly-once stream ingestion.

Desired state lives in YAML spec files, actual state in a SQL database; a pure
planner diffs the two and an applier executes the difference. Supervisor runtimes
ingest Kafka topics and RabbitMQ streams through Spark into Parquet segments,
publishing segments and offsets in one compare-and-swap transaction.
"""

__version__ = "0.1.0"
