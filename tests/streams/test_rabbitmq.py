"""RabbitStreamAdapter and RabbitRangeReader against a real RabbitMQ node (3.10, streams).

The unit tests at the top (URI parsing, AMQP 1.0 decoding, the StreamStats frame)
need no broker; the rest use the session's private node through the ``stream`` and
``rabbit_node`` fixtures. ``produce_rabbit`` sets ``properties.message_id`` to the
record key, which the reader returns as ``key``.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import threading
import time
import uuid

import pyarrow as pa
import pytest

import devservices
from reconciler.errors import PermanentError, RetryableError
from reconciler.model import PartitionRange, RabbitSource
from reconciler.streams import adapter_for
from reconciler.streams.base import RECORD_SCHEMA
from reconciler.streams.rabbitmq import (
    RabbitRangeReader,
    RabbitStreamAdapter,
    decode_chunk,
    decode_message,
    decode_stream_stats_response,
    parse_stream_uri,
)

# --------------------------------------------------------------------------- units


def _amqp(**kwargs: object) -> bytes:
    from rstream import AMQPMessage

    return bytes(AMQPMessage(**kwargs))


def test_uri_with_references(monkeypatch, tmp_path, grant_secrets):
    grant_secrets(tmp_path, ["RCT_USER"])
    secret_file = tmp_path / "pw"
    secret_file.write_text("p@ss/w:rd}\n")
    monkeypatch.setenv("RCT_USER", "svc")
    ep = parse_stream_uri(
        f"rabbitmq-stream://${{env:RCT_USER}}:${{file:{secret_file}}}@h1:5553/%2f"
    )
    assert (ep.host, ep.port, ep.vhost, ep.username, ep.password, ep.tls) == (
        "h1",
        5553,
        "/",
        "svc",
        "p@ss/w:rd}",
        False,
    )
    assert "p@ss" not in repr(ep)
    ep = parse_stream_uri("rabbitmq-stream+tls://a%40b:x%2Fy@host/prod")
    assert (ep.port, ep.vhost, ep.username, ep.password, ep.tls) == (
        5551,
        "prod",
        "a@b",
        "x/y",
        True,
    )
    assert parse_stream_uri("rabbitmq-stream://host").vhost == "/"


def test_uri_errors_never_show_the_password(grant_secrets):
    grant_secrets(None, ["RCT_SURELY_NOT_SET_42"])
    with pytest.raises(PermanentError) as err:
        parse_stream_uri("amqp://u:hunter2@host:5552/")
    assert "hunter2" not in str(err.value)
    with pytest.raises(PermanentError, match="is not set"):
        parse_stream_uri("rabbitmq-stream://u:${env:RCT_SURELY_NOT_SET_42}@host/")


@pytest.mark.parametrize(
    ("message", "key", "value"),
    [
        (dict(body=b"v", properties={"message_id": "k1"}), b"k1", b"v"),
        (dict(body=b"v" * 300, properties={"message_id": b"bin"}), b"bin", b"v" * 300),
        (dict(body=b"v", properties={"message_id": 42}), b"42", b"v"),
        (
            dict(body=b"v", properties={"message_id": uuid.UUID(int=1)}),
            str(uuid.UUID(int=1)).encode(),
            b"v",
        ),
        (dict(body=b"v", application_properties={"a": 1, "key": "app"}), b"app", b"v"),
        (
            dict(body=b"v", properties={"message_id": "mid"}, application_properties={"key": "a"}),
            b"mid",
            b"v",
        ),
        (dict(body=b"plain"), None, b"plain"),
        (dict(value="a string value"), None, b"a string value"),
        (
            dict(
                body=b"x",
                properties={"message_id": "k", "creation_time": 1700000000000, "subject": "s"},
            ),
            b"k",
            b"x",
        ),
    ],
    ids=[
        "str-id",
        "bin-id-long-body",
        "ulong-id",
        "uuid-id",
        "app-key",
        "id-wins",
        "no-key",
        "amqp-value",
        "more-properties",
    ],
)
def test_decode_message(message, key, value):
    from rstream import Properties

    if isinstance(message.get("properties"), dict):
        message = {**message, "properties": Properties(**message["properties"])}
    data = _amqp(**message)
    assert decode_message(data) == (key, value)
    # the same through the one-pass chunk decoder (fast path or fallback)
    entry = len(data).to_bytes(4, "big") + data
    assert decode_chunk(entry * 3, 3, 1, 3) == ([key, key], [value, value])


def test_decode_message_that_is_not_amqp():
    assert decode_message(b'{"raw": true}') == (None, b'{"raw": true}')
    assert decode_message(b"\x00Ss\xc0\xff") == (None, b"\x00Ss\xc0\xff")  # truncated
    assert decode_message(b"") == (None, b"")


def _chunk(messages: list[bytes]) -> bytes:
    return b"".join(len(m).to_bytes(4, "big") + m for m in messages)


@pytest.mark.parametrize(
    "make",
    [
        lambda i: dict(body=b"v%d" % i, properties={"message_id": f"key-{i}"}),
        lambda i: dict(body=b"x" * (250 + i), properties={"message_id": b"b%d" % i}),
        lambda i: dict(
            body=b"{}" * i, properties={"message_id": f"k{i}", "creation_time": 1700000000000 + i}
        ),
        lambda i: dict(body=b"no key %d" % i),
        lambda i: dict(body=b"app %d" % i, application_properties={"key": f"a{i}"}),
    ],
    ids=["str-id", "vbin32-body", "creation-time", "no-properties", "app-key"],
)
def test_chunk_arrays_agree_with_message_decoding(make):
    from rstream import Properties

    from reconciler.streams.rabbitmq import chunk_arrays

    messages = []
    for i in range(40):
        kwargs = make(i)
        if "properties" in kwargs:
            kwargs["properties"] = Properties(**kwargs["properties"])
        messages.append(_amqp(**kwargs))
    data = _chunk(messages)
    expected_keys, expected_values = decode_chunk(data, 40, 3, 37)
    arrays = chunk_arrays(data, 40, 3, 37)
    if "application_properties" in make(0):
        assert arrays is None  # not a shape cut out by position
        return
    assert arrays is not None
    assert arrays[0].to_pylist() == expected_keys
    assert arrays[1].to_pylist() == expected_values
    assert expected_values[0] == decode_message(messages[3])[1]


def test_chunk_arrays_refuse_mixed_or_odd_chunks():
    from rstream import Properties

    from reconciler.streams.rabbitmq import chunk_arrays

    with_key = _amqp(body=b"v", properties=Properties(message_id="k"))
    without = _amqp(body=b"v")
    assert chunk_arrays(_chunk([with_key, without] * 20), 40, 0, 40) is None
    assert chunk_arrays(_chunk([b'{"raw": 1}'] * 40), 40, 0, 40) is None
    assert chunk_arrays(b"\x80" + bytes(50), 1, 0, 1) is None


def test_decode_chunk_defers_sub_entry_batches():
    assert decode_chunk(b"\x80" + b"\x00" * 20, 1, 0, 1) is None


def test_stream_stats_response_decoding():
    body = (
        (0x801C).to_bytes(2, "big")
        + (1).to_bytes(2, "big")
        + (7).to_bytes(4, "big")
        + (1).to_bytes(2, "big")
        + (2).to_bytes(4, "big")
    )
    for name, value in (("first_chunk_id", 10), ("committed_chunk_id", -1)):
        body += len(name).to_bytes(2, "big") + name.encode() + value.to_bytes(8, "big", signed=True)
    assert decode_stream_stats_response(body) == (
        7,
        1,
        {"first_chunk_id": 10, "committed_chunk_id": -1},
    )


class _FakeStatsServer:
    """Just enough of the stream protocol (handshake, Open, StreamStats, Close) to check
    the StreamStats path, which the 3.10 node of these tests cannot answer."""

    def __init__(self, stats: dict[str, int], version: str = "3.13.7"):
        self.stats = stats
        self.version = version
        self.requests: list[tuple[int, str]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _string(text: str) -> bytes:
        return struct.pack(">H", len(text)) + text.encode()

    def _properties(self, pairs: list[tuple[str, str]]) -> bytes:
        return struct.pack(">i", len(pairs)) + b"".join(
            self._string(k) + self._string(v) for k, v in pairs
        )

    def _serve(self, conn: socket.socket) -> None:
        def send(key: int, body: bytes) -> None:
            frame = struct.pack(">HH", key, 1) + body
            conn.sendall(struct.pack(">I", len(frame)) + frame)

        with conn:
            reader = conn.makefile("rb")
            while True:
                head = reader.read(4)
                if len(head) < 4:
                    return
                payload = reader.read(struct.unpack(">I", head)[0])
                key = struct.unpack(">H", payload[:2])[0]
                if key == 0x14:  # the client's Tune
                    continue
                corr = struct.unpack(">I", payload[4:8])[0]
                ok = struct.pack(">IH", corr, 1)
                if key == 0x11:
                    send(0x8011, ok + self._properties([("version", self.version)]))
                elif key == 0x12:
                    send(0x8012, ok + struct.pack(">i", 1) + self._string("PLAIN"))
                elif key == 0x13:
                    send(0x8013, ok)
                    send(0x0014, struct.pack(">ii", 1 << 20, 60))
                elif key == 0x15:
                    props = [("advertised_host", "127.0.0.1"), ("advertised_port", str(self.port))]
                    send(0x8015, ok + self._properties(props))
                elif key == 0x1C:
                    n = struct.unpack(">H", payload[8:10])[0]
                    self.requests.append((key, payload[10 : 10 + n].decode()))
                    body = struct.pack(">i", len(self.stats)) + b"".join(
                        self._string(k) + struct.pack(">q", v) for k, v in self.stats.items()
                    )
                    send(0x801C, ok + body)
                elif key == 0x16:
                    send(0x8016, ok)
                    return
                else:
                    self.requests.append((key, ""))
                    return


@pytest.mark.parametrize(
    ("stats", "earliest", "latest"),
    [
        ({"first_chunk_id": 100, "committed_chunk_id": 900, "committed_offset": 949}, 100, 950),
        ({"first_chunk_id": -1, "committed_chunk_id": -1}, 0, 0),
    ],
    ids=["committed-offset", "empty"],
)
def test_stream_stats_are_used_where_the_server_has_them(stats, earliest, latest):
    server = _FakeStatsServer(stats)
    try:
        uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{server.port}/%2f"
        adapter = RabbitStreamAdapter(RabbitSource(uri=uri, streams=("s1",)), timeout=3)
        assert adapter.latest() == {"s1": latest}
        assert adapter.earliest() == {"s1": earliest}
        assert server.requests == [(0x1C, "s1"), (0x1C, "s1")]
    finally:
        server.close()


# --------------------------------------------------------------------------- brokers


def _source(node: devservices.RabbitNode, *streams: str, uri: str | None = None) -> RabbitSource:
    return RabbitSource(uri=uri or node.stream_uri, streams=tuple(streams))


def _adapter(source: RabbitSource) -> RabbitStreamAdapter:
    return RabbitStreamAdapter(source, timeout=5, empty_wait=0.3)


def _produce_groups(node, stream, groups: list[int], pause: float = 0.05) -> list[int]:
    """Produce groups of records (separate chunks) and return each group's wall time (ms)
    taken just before it was sent."""
    times = []
    n = 0
    for size in groups:
        time.sleep(pause)
        times.append(int(time.time() * 1000))
        devservices.produce_rabbit(node.stream_uri, stream, devservices.make_records(size, start=n))
        n += size
    return times


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_partitions_are_the_streams_in_order(rabbit_node, stream):
    a, b = stream(prefix="b-second"), stream(prefix="a-first")
    adapter = adapter_for(_source(rabbit_node, a, b))
    assert isinstance(adapter, RabbitStreamAdapter)
    assert adapter.partitions() == [a, b]
    adapter.close()


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_missing_stream_is_permanent(rabbit_node, stream):
    present = stream()
    adapter = _adapter(_source(rabbit_node, present, "no-such-stream-xyz"))
    for call in (adapter.partitions, adapter.latest, adapter.earliest):
        with pytest.raises(PermanentError, match="stream 'no-such-stream-xyz' does not exist"):
            call()
    reader = RabbitRangeReader(_source(rabbit_node, "no-such-stream-xyz"), timeout=3)
    with pytest.raises(PermanentError, match="does not exist"):
        list(reader.read(PartitionRange("no-such-stream-xyz", 0, 1)))


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_earliest_and_latest(rabbit_node, stream):
    full, empty = stream(), stream()
    adapter = _adapter(_source(rabbit_node, full, empty))
    assert adapter.latest() == {full: 0, empty: 0}
    assert adapter.earliest() == {full: 0, empty: 0}
    _produce_groups(rabbit_node, full, [250, 1, 40])
    assert adapter.latest() == {full: 291, empty: 0}
    assert adapter.earliest() == {full: 0, empty: 0}
    devservices.produce_rabbit(rabbit_node.stream_uri, full, devservices.make_records(9))
    assert adapter.latest()[full] == 300


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_offsets_for_time(rabbit_node, stream):
    name, empty = stream(), stream()
    times = _produce_groups(rabbit_node, name, [30, 20, 10], pause=0.2)
    adapter = _adapter(_source(rabbit_node, name, empty))
    assert adapter.offsets_for_time(times[0] - 60_000) == {name: 0, empty: 0}
    assert adapter.offsets_for_time(times[1]) == {name: 30, empty: 0}
    assert adapter.offsets_for_time(times[2]) == {name: 50, empty: 0}
    assert adapter.offsets_for_time(int(time.time() * 1000) + 60_000) == {name: 60, empty: 0}


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_sub_ranges_deliver_every_record_exactly_once(rabbit_node, stream):
    a, b = stream(), stream()
    records_a = devservices.make_records(2000)
    records_b = devservices.make_records(700, start=5000)
    devservices.produce_rabbit(rabbit_node.stream_uri, a, records_a, batch_size=300)
    devservices.produce_rabbit(rabbit_node.stream_uri, b, records_b, batch_size=1)
    source = _source(rabbit_node, a, b)
    ends = _adapter(source).latest()
    assert ends == {a: 2000, b: 700}
    reader = RabbitRangeReader(source, timeout=5)
    batches = []
    for name, end in ends.items():
        cuts = [0, 1, 333, 334, 1000, end] if end > 1000 else [0, 250, 251, end]
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            for batch in reader.read(PartitionRange(name, lo, hi), max_batch_rows=61):
                assert batch.schema == RECORD_SCHEMA
                assert 0 < batch.num_rows <= 61
                batches.append(batch)
    table = pa.Table.from_batches(batches)
    counts = collections.Counter(table.column("key").to_pylist())
    expected = {k.encode() for k, _ in records_a + records_b}
    assert set(counts) == expected, "missing or unexpected keys"
    assert max(counts.values()) == 1, "duplicated keys"
    values = {k.encode(): v for k, v in records_a + records_b}
    for row in table.to_pylist():
        assert values[row["key"]] == row["value"]
        assert row["stream_time"] is not None
    for name, end in ends.items():
        offsets = table.filter(pa.compute.equal(table["partition"], name))["offset"].to_pylist()
        assert offsets == list(range(end))


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_range_starting_inside_a_chunk(rabbit_node, stream):
    name = stream()
    devservices.produce_rabbit(rabbit_node.stream_uri, name, devservices.make_records(100))
    reader = RabbitRangeReader(_source(rabbit_node, name), timeout=5)
    table = pa.Table.from_batches(list(reader.read(PartitionRange(name, 37, 42))))
    assert table["offset"].to_pylist() == [37, 38, 39, 40, 41]
    assert table["key"].to_pylist() == [f"k{i:06d}".encode() for i in range(37, 42)]


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_raw_and_sub_entry_messages(rabbit_node, stream):
    from rstream import AMQPMessage, CompressionType, Producer, Properties

    name = stream()
    devservices.produce_rabbit(
        rabbit_node.stream_uri, name, [(None, b"raw-0"), (None, b"raw-1")], amqp=False
    )

    async def sub_entries() -> None:
        async with Producer(
            "127.0.0.1", rabbit_node.stream_port, username="guest", password="guest"
        ) as producer:
            messages = [
                AMQPMessage(body=b"sub-%d" % i, properties=Properties(message_id=f"s{i}"))
                for i in range(5)
            ]
            await producer.send_sub_entry(name, messages, compression_type=CompressionType.Gzip)
            await producer.send_wait(name, AMQPMessage(body=b"tail"))

    asyncio.run(sub_entries())
    source = _source(rabbit_node, name)
    assert _adapter(source).latest() == {name: 8}
    rows = [
        r
        for b in RabbitRangeReader(source, timeout=5).read(PartitionRange(name, 1, 8), 3)
        for r in b.to_pylist()
    ]
    # rstream flushes sub-entries on a timer, so "tail" may land before or after them
    assert [r["offset"] for r in rows] == list(range(1, 8))
    assert (rows[0]["key"], rows[0]["value"]) == (None, b"raw-1")
    subs = [(r["key"], r["value"]) for r in rows if r["key"] is not None]
    assert subs == [(b"s%d" % i, b"sub-%d" % i) for i in range(5)]
    sub_offsets = [r["offset"] for r in rows if r["key"] is not None]
    assert sub_offsets == list(range(sub_offsets[0], sub_offsets[0] + 5))
    assert [r["value"] for r in rows if r["key"] is None] == [b"raw-1", b"tail"]


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_reading_beyond_latest_raises_retryable_within_the_timeout(rabbit_node, stream):
    name = stream()
    devservices.produce_rabbit(rabbit_node.stream_uri, name, devservices.make_records(5))
    reader = RabbitRangeReader(_source(rabbit_node, name), timeout=1.5)
    for rng in (PartitionRange(name, 0, 8), PartitionRange(name, 6, 9)):
        got = []
        started = time.monotonic()
        with pytest.raises(RetryableError, match="not committed"):
            for batch in reader.read(rng, max_batch_rows=2):
                got.extend(batch["offset"].to_pylist())
        assert time.monotonic() - started < 6
        assert all(rng.start <= o < rng.end for o in got)


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_env_password_resolves_and_never_shows(monkeypatch, rabbit_node, stream, grant_secrets):
    grant_secrets(None, ["RCT_RMQ_PW"])
    name = stream()
    devservices.produce_rabbit(rabbit_node.stream_uri, name, devservices.make_records(3))
    uri = f"rabbitmq-stream://guest:${{env:RCT_RMQ_PW}}@127.0.0.1:{rabbit_node.stream_port}/%2f"
    monkeypatch.setenv("RCT_RMQ_PW", rabbit_node.password)
    source = _source(rabbit_node, name, uri=uri)
    assert _adapter(source).latest() == {name: 3}
    rows = list(RabbitRangeReader(source, timeout=5).read(PartitionRange(name, 0, 3)))
    assert sum(b.num_rows for b in rows) == 3

    wrong = "Wr0ng-Secret-Value-77"
    monkeypatch.setenv("RCT_RMQ_PW", wrong)
    for call in (_adapter(source).latest, _adapter(source).partitions):
        with pytest.raises(PermanentError) as err:
            call()
        assert wrong not in str(err.value)
        assert "${env:RCT_RMQ_PW}" in str(err.value)
    with pytest.raises(PermanentError) as err:
        list(RabbitRangeReader(source, timeout=5).read(PartitionRange(name, 0, 3)))
    assert wrong not in str(err.value)

    literal = _source(
        rabbit_node,
        name,
        uri=f"rabbitmq-stream://guest:{wrong}@127.0.0.1:{rabbit_node.stream_port}/",
    )
    with pytest.raises(PermanentError) as err:
        _adapter(literal).latest()
    assert wrong not in str(err.value)


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_missing_vhost_is_permanent(rabbit_node, stream):
    name = stream()
    uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{rabbit_node.stream_port}/no-such-vhost"
    with pytest.raises(PermanentError, match="virtual host"):
        _adapter(_source(rabbit_node, name, uri=uri)).latest()


def test_unreachable_node_is_retryable_and_quick(monkeypatch, grant_secrets):
    grant_secrets(None, ["RCT_RMQ_PW"])
    monkeypatch.setenv("RCT_RMQ_PW", "Unreachable-Secret-9")
    port = devservices.free_port()
    source = RabbitSource(
        uri=f"rabbitmq-stream://guest:${{env:RCT_RMQ_PW}}@127.0.0.1:{port}/%2f", streams=("s",)
    )
    for call in (_adapter(source).partitions, _adapter(source).latest):
        started = time.monotonic()
        with pytest.raises(RetryableError) as err:
            call()
        assert time.monotonic() - started < 5
        assert f"127.0.0.1:{port}" in str(err.value)
        assert "Unreachable-Secret-9" not in str(err.value)
    with pytest.raises(RetryableError):
        list(RabbitRangeReader(source, timeout=2).read(PartitionRange("s", 0, 1)))


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_works_from_inside_a_running_event_loop(rabbit_node, stream):
    name = stream()
    devservices.produce_rabbit(rabbit_node.stream_uri, name, devservices.make_records(4))
    source = _source(rabbit_node, name)

    async def main() -> tuple[dict[str, int], int]:
        latest = _adapter(source).latest()
        rows = sum(b.num_rows for b in RabbitRangeReader(source).read(PartitionRange(name, 0, 4)))
        return latest, rows

    assert asyncio.run(main()) == ({name: 4}, 4)
