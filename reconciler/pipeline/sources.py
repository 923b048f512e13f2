"""The stream side of a task: its share of a batch's offset ranges, and a reader for them.

A batch's ranges are cut into groups of sub-ranges, one group per task (``split_ranges``);
a task opens the spec's stream client where it runs (``open_reader``: the Kafka or RabbitMQ
range reader, secrets resolved there from their references, never carried in the job)
and reads each sub-range as ``pyarrow.RecordBatch`` objects of ``RECORD_SCHEMA``
(``conform``: microsecond timestamps, whatever the client gives).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from reconciler.model import (
    KafkaSource,
    PartitionRange,
    RabbitSource,
    source_from_document,
)
from reconciler.streams.base import record_schema

ARROW_SCHEMA = record_schema("us")  # what the transform gets: microsecond stream times

DEFAULT_MAX_BATCH_ROWS = 65536


def ranges_to_json(ranges: Iterable[PartitionRange]) -> str:
    return json.dumps(
        [{"partition": r.partition, "start": int(r.start), "end": int(r.end)} for r in ranges]
    )


def ranges_from_json(text: str) -> list[PartitionRange]:
    return [
        PartitionRange(str(d["partition"]), int(d["start"]), int(d["end"]))
        for d in json.loads(text)
    ]


# --------------------------------------------------------------------------- splitting


def split_ranges(ranges: Sequence[PartitionRange], task_count: int) -> list[list[PartitionRange]]:
    """Cut ``ranges`` into at most ``task_count`` groups of (nearly) equal offset counts.

    The non-empty ranges are laid end to end and cut at ``i * total / n``; a group is
    the list of (sub-)ranges between two cuts. Groups differ by at most one offset,
    at most ``n - 1`` cuts fall inside a range, and together the groups cover every
    offset exactly once. Empty ranges are dropped; no offsets -> no groups.
    """
    live = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in live)
    if total == 0:
        return []
    n = max(1, min(int(task_count), total))
    cuts = [i * total // n for i in range(n + 1)]
    groups: list[list[PartitionRange]] = [[] for _ in range(n)]
    pos = 0  # global position of the current range's start
    g = 0
    for r in live:
        lo, hi = pos, pos + r.size
        while lo < hi:
            while cuts[g + 1] <= lo:
                g += 1
            seg_hi = min(hi, cuts[g + 1])
            groups[g].append(
                PartitionRange(r.partition, r.start + (lo - pos), r.start + (seg_hi - pos))
            )
            lo = seg_hi
        pos = hi
    return [grp for grp in groups if grp]


def open_reader(source_document: Mapping[str, Any]) -> Any:
    """The range reader of a source document (``model.source_to_document``), built where the
    task runs; its client is imported only there (a Kafka task never loads RabbitMQ's)."""
    source = source_from_document(dict(source_document))
    if isinstance(source, KafkaSource):
        from reconciler.streams.kafka import KafkaRangeReader

        return KafkaRangeReader(source)
    if isinstance(source, RabbitSource):
        from reconciler.streams.rabbitmq import RabbitRangeReader

        return RabbitRangeReader(source)
    raise TypeError(f"unknown source type: {source!r}")


def conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A reader's batch (``RECORD_SCHEMA``, its client's time unit) as the transform reads it."""
    if batch.schema.equals(ARROW_SCHEMA):
        return batch
    try:
        return batch.cast(ARROW_SCHEMA)
    except pa.ArrowInvalid:
        # A stream time beyond a 64-bit count of microseconds (a producer's CreateTime in
        # nanoseconds, say) would fail the task, and every retry of its batch: it is null,
        # as a time that does not fit is elsewhere (``times``).
        return _bounded_stream_time(batch).cast(ARROW_SCHEMA)


def _bounded_stream_time(batch: pa.RecordBatch) -> pa.RecordBatch:
    import pyarrow.compute as pc

    index = batch.schema.get_field_index("stream_time")
    times = batch.column(index)
    per_unit = {"s": 1_000_000, "ms": 1_000}.get(getattr(times.type, "unit", None))
    if per_unit is None:
        return batch
    bound = (2**63 - 1) // per_unit
    raw = times.cast(pa.int64())
    fits = pc.and_(pc.less_equal(raw, bound), pc.greater_equal(raw, -bound))
    return batch.set_column(index, batch.schema.field(index), pc.if_else(fits, times, pa.scalar(None, times.type)))
