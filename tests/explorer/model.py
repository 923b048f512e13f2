"""The explorer's stand-ins for the two things it leaves out: a stream and Spark.

``ModelStream`` holds each partition's records in memory, with what real streams do to a
reader: offsets that hold no record (a transaction marker, a RabbitMQ tracking entry),
records that do not parse (dead letters), and retention deleting the oldest records.
``ModelAdapter`` answers the runtime's position questions from it, and ``ModelJob`` is
the batch job (``reconciler.runtime.jobs.BatchJob``): it writes the records of a batch's
ranges as Parquet files with pyarrow, exactly where and how the product's sink does
(the ranges cut into ``task_count`` offset sub-ranges by the product's ``split_ranges``, one
file per (task, time chunk) under the batch directory, dead letters beside, fsynced), and
reports what it wrote. Everything else the explorer drives is the product's own code.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reconciler import faults
from reconciler.control.resets import Positions
from reconciler.table import durable

T0 = datetime(2026, 11, 1, tzinfo=UTC)
ROW_SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()),
                        ("__partition", pa.string()), ("__offset", pa.int64())])
DEAD_SCHEMA = pa.schema([("partition", pa.string()), ("offset", pa.int64()), ("key", pa.string()),
                         ("reason", pa.string())])


@dataclass(frozen=True)
class Record:
    partition: str
    offset: int
    key: str
    bad: bool = False  # does not parse: a dead letter

    @property
    def time(self) -> datetime:
        return T0 + timedelta(minutes=7 * self.offset)  # a few hourly time chunks per batch


@dataclass
class ModelStream:
    """Partitions of records; offsets that are markers hold no record."""

    partitions: dict[str, list[Record | None]] = field(default_factory=dict)
    prefix: str = ""  # a new source (a fresh start) has keys of its own
    earliest_offset: dict[str, int] = field(default_factory=dict)
    deleted: set[tuple[str, int]] = field(default_factory=set)  # deleted by retention, never ingested
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def produce(self, partition: str, n: int, *, marker_every: int = 0, bad_every: int = 0) -> None:
        with self.lock:
            records = self.partitions.setdefault(partition, [])
            self.earliest_offset.setdefault(partition, 0)
            for _ in range(n):
                off = len(records)
                if marker_every and off % marker_every == marker_every - 1:
                    records.append(None)
                    continue
                bad = bool(bad_every) and off % bad_every == bad_every - 1
                records.append(Record(partition, off, f"{self.prefix}{partition}-{off:06d}", bad))

    def retain_from(self, partition: str, offset: int) -> None:
        """Retention deletes every record before ``offset``."""
        with self.lock:
            for off in range(self.earliest_offset.get(partition, 0), offset):
                self.deleted.add((partition, off))
            self.earliest_offset[partition] = max(self.earliest_offset.get(partition, 0), offset)

    def earliest(self) -> dict[str, int]:
        with self.lock:
            return {p: self.earliest_offset.get(p, 0) for p in self.partitions}

    def latest(self) -> dict[str, int]:
        with self.lock:
            return {p: len(r) for p, r in self.partitions.items()}

    def read(self, partition: str, start: int, end: int) -> list[Record]:
        with self.lock:
            first = self.earliest_offset.get(partition, 0)
            if start < first:
                from reconciler.errors import RetryableError

                raise RetryableError(f"partition {partition}: offset {start} is before the earliest {first}")
            return [r for r in self.partitions[partition][start:end] if r is not None]

    def records(self) -> list[Record]:
        with self.lock:
            return [r for recs in self.partitions.values() for r in recs if r is not None]

    def positions(self) -> Positions:
        return Positions(earliest=self.earliest(), latest=self.latest(), start_from=self.earliest())


class ModelAdapter:
    """``StreamAdapter`` over a ``ModelStream``."""

    def __init__(self, stream: ModelStream):
        self.stream = stream

    def partitions(self) -> list[str]:
        return sorted(self.stream.partitions)

    def earliest(self) -> dict[str, int]:
        return self.stream.earliest()

    def latest(self) -> dict[str, int]:
        return self.stream.latest()

    def offsets_for_time(self, timestamp_ms: int) -> dict[str, int]:
        return self.stream.earliest()

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class WrittenFile:
    path: str
    segment: str | None
    rows: int
    bytes: int


@dataclass(frozen=True)
class Written:
    """What the product's ``pipeline.segments.WrittenBatch`` carries, plus delivered counts."""

    batch_id: str
    files: tuple[WrittenFile, ...]
    dead_files: tuple[WrittenFile, ...]
    read_counts: Mapping[str, int]
    input_rows: int | None = None
    input_bytes: int | None = None

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def dead_rows(self) -> int:
        return sum(f.rows for f in self.dead_files)


class ModelJob:
    """``BatchJob``: the batch's records as Parquet files, as the product's sink lays them out."""

    def __init__(self, stream: ModelStream):
        self.stream = stream

    def schemas(self, data_schema) -> tuple[pa.Schema, pa.Schema]:
        return ROW_SCHEMA, DEAD_SCHEMA

    def run(self, spec, ranges: Sequence, batch_id: str, *, data_dir: Path, dead_dir: Path, task_count: int):
        from reconciler.pipeline.sources import split_ranges

        bad: list[Record] = []
        counts: dict[str, int] = {}
        files = []
        # As Spark's tasks do: each task reads its sub-ranges (a partition's range may be cut
        # between tasks) and writes its own file per time chunk.
        for task, group in enumerate(split_ranges(list(ranges), task_count)):
            good: list[Record] = []
            for rng in group:
                recs = self.stream.read(rng.partition, rng.start, rng.end)
                counts[rng.partition] = counts.get(rng.partition, 0) + len(recs)
                for r in recs:
                    (bad if r.bad else good).append(r)
            by_chunk: dict[str, list[Record]] = {}
            for r in good:
                by_chunk.setdefault(r.time.strftime("%Y%m%dT%H00Z"), []).append(r)
            for chunk, recs in sorted(by_chunk.items()):
                path = Path(data_dir) / f"time_chunk={chunk}" / f"part-{task:05d}.parquet"
                files.append(_write(path, pa.table({
                    "__time": pa.array([r.time for r in recs], pa.timestamp("us", tz="UTC")),
                    "id": [r.key for r in recs], "__partition": [r.partition for r in recs],
                    "__offset": pa.array([r.offset for r in recs], pa.int64())}, schema=ROW_SCHEMA), chunk))
        dead = []
        if bad:
            path = Path(dead_dir) / "part-00000.parquet"
            dead.append(_write(path, pa.table({
                "partition": [r.partition for r in bad], "offset": pa.array([r.offset for r in bad], pa.int64()),
                "key": [r.key for r in bad], "reason": ["does not parse"] * len(bad)}, schema=DEAD_SCHEMA), None))
        paths = [f.path for f in (*files, *dead)]
        faults.point("job-sync", batch_id)
        # As the product's sink (pipeline/segments.py): the files, their directories, up to the table's.
        durable.sync(paths, {Path(data_dir), Path(dead_dir), Path(data_dir).parent, Path(dead_dir).parent,
                             Path(data_dir).parent.parent, Path(dead_dir).parent.parent})
        return Written(batch_id, tuple(files), tuple(dead), counts, len(good) + len(bad), 0)


def _write(path: Path, table: pa.Table, segment: str | None) -> WrittenFile:
    faults.point("job-file", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return WrittenFile(str(path), segment, table.num_rows, path.stat().st_size)
