"""PySpark Python data sources that read bounded offset ranges as Arrow batches.

``spark.read.format("kafka_range")`` (or ``"rabbitmq_range"``) with options

* ``source``: JSON of the spec's ``source`` document, secret *references* only. The
  worker resolves them when it builds its client (``reconciler.spec.secrets``);
  resolved secrets never enter Spark options, plans or logs.
* ``ranges``: JSON list of ``{"partition": str, "start": int, "end": int}``, half-open.
* ``taskCount``: how many Spark tasks (readers) share the ranges; each gets roughly
  the same number of offsets, so a big partition range may be cut into sub-ranges.
* ``maxBatchRows`` (optional): rows per Arrow batch handed to Spark.

``read()`` yields ``pyarrow.RecordBatch`` objects straight from the stream readers
(``reconciler.streams.base.RECORD_SCHEMA``), so there is no per-record Python work here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from reconciler.model import (
    KafkaSource,
    PartitionRange,
    RabbitSource,
    Source,
    source_from_document,
    source_to_document,
)
from reconciler.streams.base import record_schema

# What Spark's worker checks batches against (``to_arrow_schema(schema, "UTC")``): the
# same as RECORD_SCHEMA except that Spark timestamps are microseconds, and it compares
# with ``Schema.equals`` (types and nullability), so batches are cast to exactly this.
ARROW_SCHEMA = record_schema("us")

# The data sources' Spark schema, derived from the same definition.
SPARK_RECORD_SCHEMA = from_arrow_schema(ARROW_SCHEMA)

DEFAULT_MAX_BATCH_ROWS = 65536


# --------------------------------------------------------------------------- options


def ranges_to_json(ranges: Iterable[PartitionRange]) -> str:
    return json.dumps(
        [{"partition": r.partition, "start": int(r.start), "end": int(r.end)} for r in ranges]
    )


def ranges_from_json(text: str) -> list[PartitionRange]:
    return [
        PartitionRange(str(d["partition"]), int(d["start"]), int(d["end"]))
        for d in json.loads(text)
    ]


def read_options(
    source: Source,
    ranges: Iterable[PartitionRange],
    task_count: int,
    **extra: Any,
) -> dict[str, str]:
    """Spark options for ``spark.read.format(...).options(**read_options(...))``."""
    opts = {
        "source": json.dumps(source_to_document(source), sort_keys=True),
        "ranges": ranges_to_json(ranges),
        "taskCount": str(int(task_count)),
    }
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def format_name(source: Source) -> str:
    if isinstance(source, KafkaSource):
        return KafkaRangeDataSource.name()
    if isinstance(source, RabbitSource):
        return RabbitRangeDataSource.name()
    raise TypeError(f"unknown source type: {source!r}")


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


# --------------------------------------------------------------------------- data sources


class RangesPartition(InputPartition):
    """One Spark task's share: a list of ``[start, end)`` sub-ranges."""

    def __init__(self, index: int, ranges: list[PartitionRange]):
        super().__init__([(r.partition, r.start, r.end) for r in ranges])
        self.index = index

    @property
    def ranges(self) -> list[PartitionRange]:
        return [PartitionRange(p, s, e) for p, s, e in (self.value or [])]


def conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Cast a reader's batch (RECORD_SCHEMA, ms timestamps) to what Spark expects."""
    if batch.schema.equals(ARROW_SCHEMA):
        return batch
    return batch.cast(ARROW_SCHEMA)


class _RangeReader(DataSourceReader):
    reader_class: str = ""  # "module:Class", imported on the worker

    def __init__(self, options: Mapping[str, str]):
        try:
            self.source_doc = json.loads(options["source"])
            self.ranges = ranges_from_json(options.get("ranges", "[]"))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"range data source: bad or missing option: {exc}") from None
        self.task_count = max(1, int(options.get("taskCount", "1")))
        self.max_batch_rows = max(1, int(options.get("maxBatchRows", DEFAULT_MAX_BATCH_ROWS)))

    def partitions(self) -> list[InputPartition]:
        return [
            RangesPartition(i, grp)
            for i, grp in enumerate(split_ranges(self.ranges, self.task_count))
        ]

    def _make_reader(self) -> Any:
        module, _, cls = self.reader_class.partition(":")
        mod = __import__(module, fromlist=[cls])
        return getattr(mod, cls)(source_from_document(self.source_doc))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # With no partitions at all Spark still runs one task with InputPartition(None).
        ranges = partition.ranges if isinstance(partition, RangesPartition) else []
        if not ranges:
            return iter(())
        return self._read(ranges)

    def _read(self, ranges: list[PartitionRange]) -> Iterator[pa.RecordBatch]:
        reader = self._make_reader()
        try:
            for rng in ranges:
                for batch in reader.read(rng, self.max_batch_rows):
                    if not batch.num_rows:
                        continue
                    yield conform(batch)
        finally:
            close = getattr(reader, "close", None)
            if close is not None:
                close()


class KafkaRangeReader(_RangeReader):
    reader_class = "reconciler.streams.kafka:KafkaRangeReader"


class RabbitRangeReader(_RangeReader):
    reader_class = "reconciler.streams.rabbitmq:RabbitRangeReader"


class _RangeDataSource(DataSource):
    reader_type: type[_RangeReader] = _RangeReader

    def schema(self) -> StructType:
        return SPARK_RECORD_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return self.reader_type(self.options)


class KafkaRangeDataSource(_RangeDataSource):
    """``spark.read.format("kafka_range")``: offset ranges of one Kafka topic."""

    reader_type = KafkaRangeReader

    @classmethod
    def name(cls) -> str:
        return "kafka_range"


class RabbitRangeDataSource(_RangeDataSource):
    """``spark.read.format("rabbitmq_range")``: offset ranges of a set of RabbitMQ streams."""

    reader_type = RabbitRangeReader

    @classmethod
    def name(cls) -> str:
        return "rabbitmq_range"


DATA_SOURCES: tuple[type[DataSource], ...] = (KafkaRangeDataSource, RabbitRangeDataSource)


def register(spark: Any) -> None:
    """Register both data sources and the Parquet sink with a session (idempotent)."""
    from reconciler.pipeline.sink import ParquetSink

    for ds in (*DATA_SOURCES, ParquetSink):
        spark.dataSource.register(ds)
