"""RabbitMQ Streams positions with entries no consumer is sent, and captures that are
certain: a real node, a real application storing its offsets, a real (slowed) socket.

Every ``store_offset`` of an application writes a tracking entry into the stream that
takes an offset: offsets are positions, not record counts. A range boundary or a
checkpoint may sit on such an entry. And "nothing delivered" must be known, never
concluded from a quiet second on a slow broker.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import threading
import time

import pyarrow as pa
import pytest
from rstream import Consumer

import devservices
from reconciler.errors import PermanentError, RetryableError
from reconciler.model import PartitionRange, RabbitSource
from reconciler.streams.base import RECORD_SCHEMA
from reconciler.streams.rabbitmq import RabbitRangeReader, RabbitStreamAdapter

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq]


def store_offset(node: devservices.RabbitNode, stream: str, offset: int, reference: str = "other-app") -> None:
    """What another application consuming the stream does: store its offset (rstream)."""

    async def go() -> None:
        consumer = Consumer("127.0.0.1", node.stream_port, username="guest", password="guest")
        await consumer.start()
        try:
            await consumer.store_offset(stream, reference, offset)
            # store_offset is fire and forget: reading it back proves the entry is written.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    if await consumer.query_offset(stream, reference) == offset:
                        return
                except Exception:  # noqa: BLE001 - not stored yet
                    pass
                await asyncio.sleep(0.05)
            raise AssertionError("the stored offset never became readable")
        finally:
            await consumer.close()

    asyncio.run(go())


def read_all(source: RabbitSource, cuts: list[int], stream: str) -> pa.Table:
    reader = RabbitRangeReader(source, timeout=5)
    batches = []
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        batches.extend(reader.read(PartitionRange(stream, lo, hi), max_batch_rows=37))
    return pa.Table.from_batches(batches, schema=RECORD_SCHEMA)


def test_offsets_are_positions_and_boundaries_on_bookkeeping_entries_are_normal(rabbit_node, stream):
    name = stream()
    uri = rabbit_node.stream_uri
    devservices.produce_rabbit(uri, name, devservices.make_records(100))  # offsets 0..99
    store_offset(rabbit_node, name, 99)  # offset 100: a tracking entry
    devservices.produce_rabbit(uri, name, devservices.make_records(100, start=100))  # 101..200
    store_offset(rabbit_node, name, 150)  # 201
    store_offset(rabbit_node, name, 200, reference="third-app")  # 202
    devservices.produce_rabbit(uri, name, devservices.make_records(50, start=200))  # 203..252
    store_offset(rabbit_node, name, 252)  # 253, after the last record

    source = RabbitSource(uri=uri, streams=(name,))
    adapter = RabbitStreamAdapter(source, timeout=5)
    assert adapter.earliest() == {name: 0}
    assert adapter.latest() == {name: 253}, "the end of the last record, not a count of records"

    # Boundaries on every tracking entry, at both ends of ranges, and an empty-of-records range.
    table = read_all(source, [0, 100, 101, 150, 201, 202, 203, 253], name)
    counts = collections.Counter(table["key"].to_pylist())
    assert set(counts) == {f"k{i:06d}".encode() for i in range(250)}, "missing or unexpected keys"
    assert max(counts.values()) == 1, "duplicated keys"
    offsets = table["offset"].to_pylist()
    assert offsets == [*range(0, 100), *range(101, 201), *range(203, 253)]

    # A range that starts on a tracking entry (a checkpoint there) reads from the next record.
    only = read_all(source, [100, 110], name)
    assert only["offset"].to_pylist() == list(range(101, 110))
    assert read_all(source, [201, 203], name).num_rows == 0


def test_empty_and_bookkeeping_only_streams_read_as_zero_for_certain(rabbit_node, stream):
    empty, tracked = stream(), stream()
    store_offset(rabbit_node, tracked, 0)
    adapter = RabbitStreamAdapter(RabbitSource(uri=rabbit_node.stream_uri, streams=(empty, tracked)), timeout=5)
    assert adapter.latest() == {empty: 0, tracked: 0}
    assert adapter.earliest() == {empty: 0, tracked: 0}
    assert adapter.offsets_for_time(0) == {empty: 0, tracked: 0}


class SlowRelay:
    """A TCP relay to the node that holds every server-to-client byte for ``delay``
    seconds, or forever while ``frozen``: a slow or stuck broker on a real socket."""

    def __init__(self, port: int, delay: float):
        self.target = ("127.0.0.1", port)
        self.delay = delay
        self.frozen = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self.delay), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while data := src.recv(65536):
                if delay:
                    time.sleep(delay)
                while self.frozen.is_set() and not self._stop.is_set():
                    time.sleep(0.05)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self.listener.close()


def test_a_slow_broker_is_never_taken_for_an_empty_stream(rabbit_node, stream):
    name = stream()
    devservices.produce_rabbit(rabbit_node.stream_uri, name, devservices.make_records(40))
    store_offset(rabbit_node, name, 39)
    relay = SlowRelay(rabbit_node.stream_port, delay=1.5)  # longer than the old 1 s "empty" guess
    try:
        uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{relay.port}/%2f"
        adapter = RabbitStreamAdapter(RabbitSource(uri=uri, streams=(name,)), timeout=30)
        assert adapter.latest() == {name: 40}
        assert adapter.earliest() == {name: 0}

        relay.frozen.set()  # a broker that stops answering: retryable, never a made-up 0
        stuck = RabbitStreamAdapter(RabbitSource(uri=uri, streams=(name,)), timeout=3)
        started = time.monotonic()
        with pytest.raises(RetryableError) as info:
            stuck.latest()
        assert not isinstance(info.value, PermanentError)
        assert time.monotonic() - started < 20
    finally:
        relay.frozen.clear()
        relay.close()
