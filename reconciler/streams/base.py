"""The one small interface every stream system implements.

Partitions are named by strings everywhere (a Kafka partition number as text, or a
RabbitMQ stream name), offsets are ints, and a range is half-open ``[start, end)``.

Readers yield ``pyarrow.RecordBatch`` objects with ``RECORD_SCHEMA``: a batch's Arrow
tasks (``pipeline.tasks``) and the benchmarks share them, so per-record Python work stays in one
tight loop per system.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from reconciler.errors import PermanentError
from reconciler.model import PartitionRange  # noqa: F401  (the adapters' and readers' signatures)

if TYPE_CHECKING:  # pyarrow costs a quarter of a second to import: status, plan and the store do not need it
    import pyarrow as pa


# The records every reader yields: the one definition of the record schema (issue 16).
# ``RECORD_SCHEMA`` (the readers', ms timestamps), the tasks' Arrow schema
# (``pipeline.sources``, us timestamps) and the transform's raw columns derive from it.
_RECORD_FIELDS = (
    ("partition", "string"),
    ("offset", "int64"),
    ("key", "binary"),
    ("value", "binary"),
    ("stream_time", "timestamp"),  # UTC
)
RECORD_COLUMNS = tuple(name for name, _ in _RECORD_FIELDS)


def record_schema(time_unit: str = "ms") -> pa.Schema:
    """The record schema in Arrow, its ``stream_time`` in ``time_unit`` (ms: the readers;
    us: what the transform reads)."""
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "int64": pa.int64(),
        "binary": pa.binary(),
        "timestamp": pa.timestamp(time_unit, tz="UTC"),
    }
    return pa.schema([(name, types[kind]) for name, kind in _RECORD_FIELDS])


def __getattr__(name: str) -> Any:
    """``RECORD_SCHEMA`` is built (and pyarrow imported) on first use: the readers and the
    Spark sources use it, the control plane (store, plan, status) never does."""
    if name == "RECORD_SCHEMA":
        schema = globals()["RECORD_SCHEMA"] = record_schema("ms")
        return schema
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SourceMissing(PermanentError):
    """The topic or stream is not there. Permanent once it lasts, but a broker may answer
    so for a moment (a topic just created, metadata not yet propagated, a leader moving):
    callers that act once, like a reset, ask again a few times before they give up."""


class StreamAdapter(Protocol):
    """Positions of one source (a Kafka topic, or a set of RabbitMQ streams)."""

    def partitions(self) -> list[str]:
        """Every partition of the source, in a stable order."""

    def earliest(self) -> dict[str, int]:
        """The first available offset per partition."""

    def latest(self) -> dict[str, int]:
        """The offset after the last committed record, per partition (the end)."""

    def offsets_for_time(self, timestamp_ms: int) -> dict[str, int]:
        """Per partition, the first offset whose record time is >= timestamp (end if none)."""

    def record_times(self, offsets: Mapping[str, int]) -> dict[str, int | None]:
        """Per asked partition, the broker's timestamp (ms) of the record at (or first after)
        the offset; None when the partition ends there; absent when not known in time. One
        fetch per partition, bounded by the adapter's timeout (``streams.lagtime``)."""

    def identity(self) -> str | None:
        """An id that a source deleted and created again never shares with the old one
        (Kafka's topic id); None when the system gives none."""

    def holds(self, partition: str, offset: int) -> bool:
        """Whether the partition still holds a record at ``offset`` or after it. Asked only
        when a checkpoint is above the reported end, to tell a truncated or re-created
        partition (False) from a broker that under-reports its end (True)."""

    # Optional: ``records_at(offsets) -> {partition: (offset, timestamp ms) | None}``, the first
    # record at or after each offset (None: no longer held). Kafka has it (a compacted record
    # answers a later offset); without it ``runtime.fingerprint`` asks ``record_times``.

    def close(self) -> None: ...


class RangeReader(Protocol):
    def read(self, rng: PartitionRange, max_batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
        """Exactly the records with offsets in ``[rng.start, rng.end)``, in offset order."""

    # Optional: ``read_many(ranges, max_batch_rows) -> Iterator[(range, batch)]``, ``read``'s
    # contract for several ranges of distinct partitions at once, their batches interleaved
    # (Kafka has it: one consumer and one fetch for a task's partitions); a task without it
    # reads its ranges one after the other (``pipeline.tasks._read_all``).


def lag(checkpoint: Mapping[str, int], latest: Mapping[str, int]) -> dict[str, int]:
    return {p: max(0, latest[p] - checkpoint.get(p, latest[p])) for p in latest}
