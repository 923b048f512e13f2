"""stream-reconciler: a declarative reconciler for exactly-once stream ingestion.

Desired state lives in YAML spec files, actual state in a SQL database; a pure
planner diffs the two and an applier executes the difference. Supervisor runtimes
ingest Kafka topics and RabbitMQ streams through Spark into Apache Iceberg tables,
publishing a table commit and the offsets in one compare-and-swap transaction.
"""

from importlib.metadata import PackageNotFoundError, version

try:  # the installed distribution's, which the git tag gave it (pyproject.toml)
    __version__ = version("stream-reconciler")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"
