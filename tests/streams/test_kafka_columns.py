"""The Kafka reader's bulk path (``streams.kafka.columns``) without a broker: real
``confluent_kafka.Message`` objects, as ``Consumer.consume`` hands them, in scripted chunks.

Each case is compared with the records built one message at a time, as the reader did
before the bulk path: offsets exactly as delivered (gaps from compaction or transaction
markers kept), keys and values as given (None too), a negative timestamp as null.
"""

from __future__ import annotations

from collections import deque

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, Message

from reconciler.model import KafkaSource, PartitionRange
from reconciler.streams.base import RECORD_SCHEMA
from reconciler.streams.kafka.columns import Columns, any_error
from reconciler.streams.kafka.reader import KafkaRangeReader

T0 = 1_700_000_000_000


def _msg(offset: int, value: bytes | None = b"v", key: bytes | None = None, ts: int | None = None) -> Message:
    stamp = (1, T0 + offset if ts is None else ts)
    return Message(topic="t", partition=0, offset=offset, key=key, value=value, timestamp=stamp)


def _eof(offset: int) -> Message:
    return Message(topic="t", partition=0, offset=offset, error=KafkaError(KafkaError._PARTITION_EOF))


def _expected(msgs: list[Message], partition: str = "0") -> pa.RecordBatch:
    """One message at a time: the reference."""
    stamps = [m.timestamp()[1] for m in msgs]
    return pa.RecordBatch.from_arrays(
        [pa.array([partition] * len(msgs), pa.string()),
         pa.array([m.offset() for m in msgs], pa.int64()),
         pa.array([m.key() for m in msgs], pa.binary()),
         pa.array([m.value() for m in msgs], pa.binary()),
         pa.array([s if s >= 0 else None for s in stamps], pa.int64()).cast(RECORD_SCHEMA.field("stream_time").type)],
        schema=RECORD_SCHEMA)


CHUNKS = {
    "contiguous": [[_msg(o) for o in range(0, 5)], [_msg(o) for o in range(5, 9)]],
    "compaction gaps": [[_msg(o) for o in (0, 1, 4, 5, 9)], [_msg(o) for o in (10, 12)]],
    # a gap inside a chunk whose count still equals its span cannot be: offsets increase
    "gap between chunks": [[_msg(o) for o in range(0, 3)], [_msg(o) for o in range(7, 10)]],
    "tombstones and keys": [[_msg(0, None, b"k0"), _msg(1, b"", None), _msg(2, b"x" * 300, b"")]],
    "all values null": [[_msg(o, None) for o in range(4)]],
    "no timestamps": [[_msg(0, ts=-1), _msg(1), _msg(2, ts=-1)]],
    "non-ASCII and NUL bytes": [[_msg(0, "é€".encode() + b"\x00\xff", b"\x00"), _msg(1, b"{}")]],
}


@pytest.mark.parametrize("chunks", list(CHUNKS.values()), ids=list(CHUNKS))
@pytest.mark.parametrize("rows", [1, 2, 3, 100])
def test_columns_cut_the_same_records_as_one_message_at_a_time(chunks, rows):
    columns = Columns("0")
    got = []
    for chunk in chunks:
        columns.add(chunk)
        while columns.rows >= rows:
            got.append(columns.take(rows))
    if columns.rows:
        got.append(columns.take(columns.rows))
    every = [m for chunk in chunks for m in chunk]
    assert all(b.num_rows <= rows for b in got)
    assert pa.Table.from_batches(got, schema=RECORD_SCHEMA).equals(
        pa.Table.from_batches([_expected(every)], schema=RECORD_SCHEMA))


def test_any_error_finds_an_event_anywhere_in_a_chunk():
    assert not any_error([_msg(0), _msg(1)])
    assert any_error([_msg(0), _eof(1), _msg(2)])
    assert any_error([_eof(0)])


class _Scripted:
    """A consumer that hands out scripted chunks, then nothing."""

    def __init__(self, chunks: list[list[Message]]):
        self.chunks = deque(chunks)
        self.assigned: list[int] = []
        self.asked: list[int] = []
        self.paused: list[int] = []

    def assign(self, tps):
        self.assigned += [tp.offset for tp in tps]

    def consume(self, num_messages=1, timeout=-1):
        self.asked.append(num_messages)
        return self.chunks.popleft() if self.chunks else []

    def pause(self, tps):  # a range's end reached: no more fetches for it
        self.paused += [tp.partition for tp in tps]

    def close(self):
        pass


def _read(chunks: list[list[Message]], start: int, end: int, rows: int = 4) -> tuple[list[int], _Scripted]:
    consumer = _Scripted(chunks)
    reader = KafkaRangeReader(KafkaSource(bootstrap_servers="127.0.0.1:1", topic="t"), timeout=2)
    reader._consumer = lambda: (consumer, deque())  # the seam: the client, not the broker
    batches = list(reader.read(PartitionRange("0", start, end), max_batch_rows=rows))
    assert all(b.schema == RECORD_SCHEMA and 0 < b.num_rows <= rows for b in batches)
    return [o for b in batches for o in b.column("offset").to_pylist()], consumer


def test_a_chunk_past_the_range_end_is_cut_at_the_end():
    offsets, _ = _read([[_msg(o) for o in range(3, 8)], [_msg(o) for o in range(8, 20)]], 3, 11)
    assert offsets == list(range(3, 11))


def test_a_chunk_below_the_position_is_cut_at_the_position():
    """Never expected of librdkafka; the range is still read exactly once."""
    offsets, _ = _read([[_msg(o) for o in range(5, 8)], [_msg(o) for o in range(6, 12)]], 5, 10)
    assert offsets == [5, 6, 7, 8, 9]


def test_an_eof_at_or_past_the_end_ends_a_range_whose_last_offsets_hold_no_record():
    """A transaction marker (or compaction) left 8 and 9 without a record."""
    offsets, consumer = _read([[_msg(5), _msg(7), _eof(10), _msg(10)]], 5, 10)
    assert offsets == [5, 7]
    assert len(consumer.asked) == 1  # no wait for offsets that never come


def test_an_eof_before_the_end_is_not_the_end():
    offsets, _ = _read([[_msg(0), _eof(1)], [_msg(1), _msg(3)], [_eof(5)]], 0, 5)
    assert offsets == [0, 1, 3]


def test_records_after_an_eof_past_the_end_are_not_read():
    offsets, _ = _read([[_msg(0), _msg(1), _eof(4), _msg(4), _msg(5)]], 0, 4)
    assert offsets == [0, 1]
