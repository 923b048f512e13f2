"""The explorer's stand-ins for the two things it leaves out: a stream and Spark.

``ModelStream`` holds each partition's records in memory, with what real streams do to a
reader: offsets that hold no record (a transaction marker, a RabbitMQ tracking entry),
records that do not parse (dead letters), and retention deleting the oldest records.
``ModelAdapter`` answers the runtime's position questions from it, and ``ModelJob`` is
the batch job (``reconciler.runtime.jobs.BatchJob``): it writes the records of a batch's
ranges as Parquet files with pyarrow, exactly where the product's tasks do (the ranges cut
into ``task_count`` offset sub-ranges by the product's ``split_ranges``, one file per (task,
time chunk) under the batch directory, dead letters beside), then hands what they described
to the product's own driver side, ``pipeline.segments.finish`` (keeps the described files,
fsyncs them and their directories): a power cut tests the product's sync, not a model's. Everything else the explorer drives is the product's own code.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reconciler import faults
from reconciler.control.resets import Positions

T0 = datetime(2026, 11, 1, tzinfo=UTC)
ROW_SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()),
                        ("__partition", pa.string()), ("__offset", pa.int64())])
# The product's own dead-letter layout (values kept): a replay parses them again.
DEAD_SCHEMA = pa.schema([("partition", pa.string()), ("offset", pa.int64()), ("key", pa.binary()),
                         ("value", pa.binary()), ("reason", pa.string())])


@dataclass(frozen=True)
class Record:
    partition: str
    offset: int
    key: str
    bad: bool = False  # does not parse under the spec's ``format: millis``: a dead letter
    fixable: bool = False  # bad, with an ISO ``ts``: ``format: auto`` parses it (a replay brings it back)

    @property
    def time(self) -> datetime:
        return T0 + timedelta(minutes=7 * self.offset)  # a few hourly time chunks per batch

    @property
    def ts(self) -> str:
        if not self.bad:
            return str(int(self.time.timestamp() * 1000))
        return self.time.isoformat() if self.fixable else "not a time"

    def value(self) -> bytes:
        ts = self.ts if not self.bad else f'"{self.ts}"'
        return f'{{"id":"{self.key}","ts":{ts}}}'.encode()

    def dead_under(self, timestamp_format: str) -> bool:
        return self.bad and not (self.fixable and timestamp_format == "auto")


@dataclass
class ModelStream:
    """Partitions of records; offsets that are markers hold no record."""

    partitions: dict[str, list[Record | None]] = field(default_factory=dict)
    prefix: str = ""  # a new source (a fresh start) has keys of its own
    earliest_offset: dict[str, int] = field(default_factory=dict)
    deleted: set[tuple[str, int]] = field(default_factory=set)  # deleted by retention, never ingested
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # A broker's end answered from a replica or a cache lags the true end: up to this many
    # offsets short, drawn from ``lag_rng`` (seeded by the schedule: the same seed, the same answers).
    under_report: int = 0
    lag_rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

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
                fixable = bad and (off // bad_every) % 3 != 2  # one in three no spec brings back
                records.append(Record(partition, off, f"{self.prefix}{partition}-{off:06d}", bad, fixable))

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

    def reported_latest(self) -> dict[str, int]:
        """The end a broker answers: the true one, or (``under_report``) a few offsets short."""
        with self.lock:
            out = {}
            for p, r in self.partitions.items():
                short = self.lag_rng.randint(0, self.under_report) if self.under_report else 0
                out[p] = max(self.earliest_offset.get(p, 0), len(r) - short)
            return out

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
        return Positions(earliest=self.earliest(), latest=self.reported_latest(), start_from=self.earliest())


class ModelAdapter:
    """``StreamAdapter`` over a ``ModelStream``."""

    def __init__(self, stream: ModelStream):
        self.stream = stream

    def partitions(self) -> list[str]:
        return sorted(self.stream.partitions)

    def earliest(self) -> dict[str, int]:
        return self.stream.earliest()

    def latest(self) -> dict[str, int]:
        return self.stream.reported_latest()

    def offsets_for_time(self, timestamp_ms: int) -> dict[str, int]:
        return self.stream.earliest()

    def close(self) -> None:
        pass


class ModelJob:
    """``BatchJob``: the batch's records as Parquet files, as the product's sink lays them out."""

    def __init__(self, stream: ModelStream, owner: str = "", owners: dict[str, str] | None = None):
        self.stream = stream
        self.owner = owner  # the process whose batches these are
        self.owners = owners if owners is not None else {}  # batch id -> process, the world's

    def schemas(self, data_schema) -> tuple[pa.Schema, pa.Schema]:
        return ROW_SCHEMA, DEAD_SCHEMA

    def run(self, spec, ranges: Sequence, batch_id: str, *, data_dir: Path, dead_dir: Path, task_count: int):
        from reconciler.pipeline import segments, tasks
        from reconciler.pipeline.sources import split_ranges

        self.owners[batch_id] = self.owner
        fmt = spec.data_schema.timestamp_format
        bad: list[Record] = []
        counts: dict[str, int] = {}
        described: list[tasks.FileDescription] = []
        read = 0
        # As Spark's tasks do: each task reads its sub-ranges (a partition's range may be cut
        # between tasks) and writes its own file per time chunk.
        for task, group in enumerate(split_ranges(list(ranges), task_count)):
            good: list[Record] = []
            for rng in group:
                recs = self.stream.read(rng.partition, rng.start, rng.end)
                counts[rng.partition] = counts.get(rng.partition, 0) + len(recs)
                read += len(recs)
                for r in recs:
                    (bad if r.dead_under(fmt) else good).append(r)
            by_chunk: dict[str, list[Record]] = {}
            for r in good:
                by_chunk.setdefault(r.time.strftime("%Y%m%dT%H00Z"), []).append(r)
            for chunk, recs in sorted(by_chunk.items()):
                name = f"time_chunk={chunk}/part-{task:05d}.parquet"
                described.append(_write(Path(data_dir), name, tasks.DATA, pa.table({
                    "__time": pa.array([r.time for r in recs], pa.timestamp("us", tz="UTC")),
                    "id": [r.key for r in recs], "__partition": [r.partition for r in recs],
                    "__offset": pa.array([r.offset for r in recs], pa.int64())}, schema=ROW_SCHEMA), chunk))
        if bad:
            described.append(_write(Path(dead_dir), "part-00000.parquet", tasks.DEAD, pa.table({
                "partition": [r.partition for r in bad], "offset": pa.array([r.offset for r in bad], pa.int64()),
                "key": [r.key.encode() for r in bad], "value": [r.value() for r in bad],
                "reason": [f"unparseable timestamp ({fmt}): {r.ts}" for r in bad]}, schema=DEAD_SCHEMA), None))
        faults.point("job-sync", batch_id)
        # The product's own driver side from here (pipeline/segments.py): what the tasks
        # described kept, anything else deleted, the files and their directories fsynced.
        return segments.finish(tasks.TaskResults(tuple(described), read, 0, counts), data_dir, dead_dir, batch_id)


def _write(root: Path, name: str, kind: str, table: pa.Table, chunk: str | None):
    from reconciler.pipeline.tasks import FileDescription

    path = root / name
    faults.point("job-file", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return FileDescription(kind, name, chunk, table.num_rows, path.stat().st_size)
