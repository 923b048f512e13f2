"""Delivered messages of one partition into ``RECORD_SCHEMA`` batches, in bulk.

The reader's cost over the bare client is per-message Python: a comprehension per
accessor, a bound method looked up per message and call, a tuple indexed per timestamp,
and lists of Python ints converted element by element. Here each accessor runs once per
message as an unbound method mapped over the chunk (C-level iteration), numbers go
straight into numpy, and offsets are not read at all where the chunk's first and last
prove them: librdkafka hands one partition's messages in strictly increasing offsets
(it drops what lies below the fetch position), so a chunk of ``last - first + 1``
messages holds every offset of that span once. A chunk with gaps (compaction,
transaction markers) has its offsets read one by one.

Keys and values stay ``pa.array`` of the collected bytes: joining them into one buffer
made the reader cheaper but the Parquet writer dearer by more in ``cpu_floor.py`` (its
pages came back fresh from the system, 5 runs of 5), so the join was not kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import numpy as np
import pyarrow as pa
from confluent_kafka import Message

from reconciler.streams.base import RECORD_SCHEMA

_ERROR = Message.error
_OFFSET = Message.offset
_KEY = Message.key
_VALUE = Message.value
_TIMESTAMP = Message.timestamp
_SECOND = itemgetter(1)
_STREAM_TIME = RECORD_SCHEMA.field("stream_time").type


def any_error(msgs: Sequence[Message]) -> bool:
    """Whether a chunk holds an event (EOF, an error) rather than only records: a
    ``KafkaError`` is truthy, a record's ``error()`` None."""
    return any(map(_ERROR, msgs))


def offsets_of(msgs: Sequence[Message]) -> list[int]:
    return list(map(_OFFSET, msgs))


class Columns:
    """The records of one partition collected so far, cut into batches by ``take``."""

    def __init__(self, partition: str):
        self.partition = partition
        self.rows = 0
        self._offsets: list[np.ndarray] = []
        self._stamps: list[np.ndarray] = []
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._parts: dict[int, pa.Array] = {}

    def add(self, msgs: Sequence[Message]) -> None:
        """Records only (no events), in offset order, all within the range."""
        n = len(msgs)
        first, last = msgs[0].offset(), msgs[-1].offset()
        # The middle message too: a chunk that repeated some offsets and skipped as many
        # (only a misbehaving broker could send one) would otherwise pass the count check.
        if last - first + 1 == n and msgs[n // 2].offset() == first + n // 2:
            offsets = np.arange(first, last + 1, dtype=np.int64)
        else:
            offsets = np.fromiter(map(_OFFSET, msgs), np.int64, n)
        self._offsets.append(offsets)
        self._stamps.append(np.fromiter(map(_SECOND, map(_TIMESTAMP, msgs)), np.int64, n))
        self._keys.extend(map(_KEY, msgs))
        self._values.extend(map(_VALUE, msgs))
        self.rows += n

    def take(self, n: int) -> pa.RecordBatch:
        """The first ``n`` records held (``n <= rows``) as one batch."""
        offsets, self._offsets = _cut(self._offsets, n)
        stamps, self._stamps = _cut(self._stamps, n)
        keys, values = self._keys[:n], self._values[:n]
        del self._keys[:n], self._values[:n]
        self.rows -= n
        # -1 (or any negative): the record has no timestamp
        ts = pa.array(stamps, pa.int64(), mask=stamps < 0) if (stamps < 0).any() else pa.array(stamps)
        return pa.RecordBatch.from_arrays(
            [self._partition(n), pa.array(offsets), pa.array(keys, pa.binary()),
             pa.array(values, pa.binary()), ts.cast(_STREAM_TIME)],
            schema=RECORD_SCHEMA,
        )

    def _partition(self, n: int) -> pa.Array:
        arr = self._parts.get(n)
        if arr is None:
            arr = pa.repeat(pa.scalar(self.partition, pa.string()), n)
            if len(self._parts) < 8:  # a range's batches are of few sizes: full ones and its last
                self._parts[n] = arr
        return arr


def _cut(chunks: list[np.ndarray], n: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(the first ``n`` values of ``chunks``, the chunks left)."""
    whole = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    if n >= len(whole):
        return whole, []
    return whole[:n], [whole[n:]]
