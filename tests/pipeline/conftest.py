"""Pipeline test helpers: a stand-in stream for task tests without a broker.

``FakeStreamReader`` serves records generated from the offset alone, through the same
task machinery as the Kafka and RabbitMQ readers (``tasks.TaskPlan.reader``: range
splitting, Arrow batches, schema conformance). The module is pickled by value so that
Spark's Python workers need not import it from the tests directory.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from reconciler.model import PartitionRange
from reconciler.streams.base import RECORD_SCHEMA

BASE_MS = 1_763_640_000_000  # 2025-11-20T12:00:00Z


def record_value(partition: str, offset: int) -> bytes:
    return json.dumps(
        {
            "id": f"{partition}-{offset}",
            "ts": BASE_MS + offset * 1000,
            "user": f"u{offset % 7}",
            "bytes": offset % 1000,
        }
    ).encode()


def make_batch(partition: str, start: int, end: int) -> pa.RecordBatch:
    offsets = list(range(start, end))
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partition] * n, pa.string()),
            pa.array(offsets, pa.int64()),
            pa.array([f"{partition}-{o}".encode() for o in offsets], pa.binary()),
            pa.array([record_value(partition, o) for o in offsets], pa.binary()),
            pa.array([BASE_MS + o for o in offsets], pa.timestamp("ms", tz="UTC")),
        ],
        schema=RECORD_SCHEMA,
    )


class FakeStreamReader:
    """The RangeReader interface over generated records (RECORD_SCHEMA, ms timestamps)."""

    def __init__(self, source: object = None):
        self.source = source

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536):
        pos = rng.start
        while pos < rng.end:
            stop = min(rng.end, pos + max_batch_rows)
            yield make_batch(rng.partition, pos, stop)
            pos = stop


class OddStreamReader(FakeStreamReader):
    """The stand-in stream with every 100th record not JSON."""

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536):
        for b in super().read(rng, max_batch_rows):
            offsets, values = b.column("offset").to_pylist(), b.column("value").to_pylist()
            odd = [b"{broken" if o % 100 == 0 else v for o, v in zip(offsets, values, strict=True)]
            yield b.set_column(3, "value", pa.array(odd, pa.binary()))


class FailingStreamReader(FakeStreamReader):
    """Fails after its third batch, as a broker that went away mid-read."""

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536):
        for i, b in enumerate(super().read(rng, max_batch_rows)):
            if i == 3:
                raise RuntimeError("the broker went away")
            yield b


class CollectorCheckingReader(FakeStreamReader):
    """Fails a read that runs while the cyclic collector is on, or with another pool than
    jemalloc (or the one the environment names): a task sets both before it reads
    (``heap.collections_paused``, ``arrowpool``)."""

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536):
        import gc
        import os

        for b in super().read(rng, max_batch_rows):
            if gc.isenabled():
                raise RuntimeError("a task read with the cyclic collector on")
            if pa.default_memory_pool().backend_name != (os.environ.get("ARROW_DEFAULT_MEMORY_POOL") or "jemalloc"):
                raise RuntimeError(f"a task read with {pa.default_memory_pool().backend_name}")
            yield b


cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def fakes():
    """This module: ``make_batch``, ``record_value``, ``FakeStreamReader``."""
    return sys.modules[__name__]
