"""Sub-entry batches of every codec the stream protocol defines (issue 41.4).

The unit tests build chunks by hand and hand rstream's own ``Deliver`` frames to the
reader's ``Columns``; the integration tests publish with rstream's Producer (with the
Java client's formats registered as codecs, ``tests/streams/subentries.py``) to the real
node and read with ``RabbitRangeReader``.
"""

from __future__ import annotations

import collections
import tracemalloc
import zlib

import pyarrow as pa
import pytest
from rstream import CompressionType, schema

from reconciler.model import PartitionRange, RabbitSource
from reconciler.streams.rabbitmq import RabbitRangeReader
from reconciler.streams.rabbitmq.arrow import DEAD_LETTER_SCHEMA, Columns
from reconciler.streams.rabbitmq.codecs import MAX_SUB_ENTRY_BYTES, Refused, decompress
from tests.streams import subentries as se

KINDS = [CompressionType.No, CompressionType.Gzip, CompressionType.Snappy,
         CompressionType.Lz4, CompressionType.Zstd]


def _records(prefix: str, n: int) -> list[tuple[str, bytes]]:
    return [(f"{prefix}{i:04d}", b'{"id": "%s%04d", "ts": 1}' % (prefix.encode(), i)) for i in range(n)]


def _sub_entry(code: int, count: int, declared: int, payload: bytes) -> bytes:
    return (bytes([0x80 | code << 4]) + count.to_bytes(2, "big") + declared.to_bytes(4, "big")
            + len(payload).to_bytes(4, "big") + payload)


def _entry(key: str, value: bytes) -> bytes:
    m = bytes(se.message(key, value))
    return len(m).to_bytes(4, "big") + m


def _compressed(kind: CompressionType, records: list[tuple[str, bytes]]) -> bytes:
    plain = se._plain([se.message(k, v) for k, v in records])
    return _sub_entry(kind.value, len(records), len(plain), se.COMPRESS[kind](plain))


def _frame(entries: list[bytes], num_records: int, first: int = 100) -> schema.Deliver:
    data = b"".join(entries)
    return schema.Deliver(subscription_id=0, magic_version=0x50, chunk_type=0, num_entries=len(entries),
                          num_records=num_records, timestamp=1_700_000_000_000, epoch=1,
                          chunk_first_offset=first, chunk_crc=zlib.crc32(data), data_length=len(data),
                          trailer_length=0, _reserved=0, data=data)


def _read(frame: schema.Deliver, start: int, end: int) -> tuple[list[dict], list[dict]]:
    cols = Columns("s")
    cols.add_chunk(frame, start, end)
    batches = list(cols.batches(final=True))
    rows = [r for b in batches if "reason" not in b.schema.names for r in b.to_pylist()]
    return rows, [d for b in batches if "reason" in b.schema.names for d in b.to_pylist()]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_codec_of_the_protocol_is_decoded(kind):
    a, b = _records("a", 40), _records("b", 3)
    frame = _frame([_entry("p0", b"plain"), _compressed(kind, a), _compressed(kind, b)], 1 + 40 + 3)
    rows, dead = _read(frame, 100, 144)
    assert dead == []
    assert [r["offset"] for r in rows] == list(range(100, 144))
    assert [(r["key"].decode(), r["value"]) for r in rows] == [("p0", b"plain"), *a, *b]
    # a range that starts and ends inside the sub-entries
    rows, _ = _read(frame, 120, 142)
    assert [r["key"].decode() for r in rows] == [k for k, _ in (a + b)[19:41]]


@pytest.mark.parametrize(
    "code,payload,declared,why",
    [
        pytest.param(4, b"not zstd at all", 40, "zstd: ", id="zstd-corrupt"),
        pytest.param(3, b"\x04\x22\x4d\x18 garbage", 40, "lz4: ", id="lz4-corrupt"),
        pytest.param(2, b"\xff\x06\x00\x00sNaPpY\x00\x08\x00\x00abcd\x0a\xff\xff\xff", 40,
                     "snappy: ", id="snappy-corrupt"),
        pytest.param(2, b"\xff\x06\x00\x00sNaPpY\x00\x09\x00\x00abcd\xff\xff\xff\xff\x0f", 40,
                     "snappy chunk of 4294967295 bytes", id="snappy-oversized-chunk"),
        pytest.param(2, b"\x00\x05\x00\x00abcde", 40, "no stream identifier", id="snappy-unframed"),
        pytest.param(1, b"\x1f\x8b garbage", 40, "gzip: ", id="gzip-corrupt"),
        pytest.param(5, b"whatever", 8, "compression type 5 is not one", id="unknown-codec"),
        pytest.param(0, b"short", 40, "none data is 5 bytes uncompressed, its header declares 40",
                     id="none-wrong-size"),
        pytest.param(0, (9).to_bytes(4, "big") + b"x", 5, "record 0 of 3 runs past", id="records-short"),
    ],
)
def test_an_undecodable_sub_entry_is_dead_letters_and_the_rest_is_read(code, payload, declared, why):
    after = _records("z", 2)
    frame = _frame([_entry("p0", b"before"), _sub_entry(code, 3, declared, payload),
                    _compressed(CompressionType.Zstd, after)], 1 + 3 + 2)
    rows, dead = _read(frame, 100, 106)
    assert [(r["offset"], r["key"]) for r in rows] == [(100, b"p0"), (104, b"z0000"), (105, b"z0001")]
    assert [d["offset"] for d in dead] == [101, 102, 103]
    assert all(d["reason"].startswith("undecodable sub-entry (") for d in dead)
    assert all("at offsets [101, 104): " in d["reason"] and why in d["reason"] for d in dead)
    assert dead[0]["value"] == _sub_entry(code, 3, declared, payload)  # the entry's bytes, once
    assert [d["value"] for d in dead[1:]] == [None, None]
    # only the offsets asked for, and a range beside the entry does not decompress it
    assert [d["offset"] for d in _read(frame, 102, 106)[1]] == [102, 103]
    assert _read(frame, 104, 106)[1] == []
    assert pa.RecordBatch.from_pylist(dead, schema=DEAD_LETTER_SCHEMA).num_rows == 3


def test_an_entry_running_past_the_chunk_makes_the_rest_of_the_chunk_dead():
    frame = _frame([_entry("p0", b"v"), _sub_entry(4, 2, 10, b"abc")[:-2]], 3)
    rows, dead = _read(frame, 100, 103)
    assert [r["offset"] for r in rows] == [100]
    assert [d["offset"] for d in dead] == [101, 102]
    assert "runs past the chunk's end" in dead[0]["reason"]


@pytest.mark.parametrize("declared", [1024, MAX_SUB_ENTRY_BYTES], ids=["header-lies", "header-at-the-bound"])
def test_a_gzip_bomb_is_refused_within_bounded_memory(declared):
    """256 MiB of zeros in ~250 KiB on the wire: decompression stops one byte past what the
    header declares, so the peak stays within twice the bound (zlib's output buffer and its
    trimmed copy), not near 256 MiB (rstream's gunzip took it all, then failed the read)."""
    bomb = se.gzip_of_zeros(256 << 20)
    assert len(bomb) < 1 << 20
    frame = _frame([_sub_entry(1, 1, declared, bomb), _entry("after", b"v")], 2)
    tracemalloc.start()
    try:
        rows, dead = _read(frame, 100, 102)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * declared + (16 << 20)
    assert [r["key"] for r in rows] == [b"after"]
    assert [d["offset"] for d in dead] == [100]
    assert f"decompresses to more than the {declared} bytes its header declares" in dead[0]["reason"]


def test_a_header_beyond_the_bound_is_refused_before_decompressing():
    with pytest.raises(Refused, match="more than the 67108864 one sub-entry may hold"):
        decompress(0x90, se.gzip_of_zeros(1 << 20), MAX_SUB_ENTRY_BYTES + 1)


def test_each_codec_stops_at_the_declared_size():
    plain = bytes(1 << 20)
    for kind in KINDS[1:]:
        with pytest.raises(Refused, match="decompresses to more than the 1000 bytes"):
            decompress(0x80 | kind.value << 4, se.COMPRESS[kind](plain), 1000)


def test_zstd_frames_one_after_another_and_skippable_frames_are_read():
    """The one-shot decompress reads one frame: the frames are cut by their block headers."""
    import zstandard

    recs = _records("f", 6)
    plain = se._plain([se.message(k, v) for k, v in recs])
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"12345"
    sized = zstandard.ZstdCompressor(write_checksum=True).compress(plain[:100])
    payload = sized + skippable + se.zstd_streamed(plain[100:])
    rows, dead = _read(_frame([_sub_entry(4, 6, len(plain), payload)], 6), 100, 106)
    assert dead == []
    assert [(r["key"].decode(), r["value"]) for r in rows] == recs
    with pytest.raises(Refused, match="zstd: the frame is cut short"):
        decompress(0xC0, payload[:-3], len(plain))


def test_a_zstd_frame_stating_a_content_size_over_the_header_is_refused_before_decompressing():
    """zstandard allocates the size a frame states: 1 TiB stated is refused, not allocated."""
    import zstandard

    frame = zstandard.ZstdCompressor().compress(bytes(2000))
    params = zstandard.get_frame_parameters(frame)
    assert params.content_size == 2000
    # the same frame header with an 8-byte content size field of 1 TiB
    lying = bytes([0x28, 0xB5, 0x2F, 0xFD, 0xE0]) + (1 << 40).to_bytes(8, "little") + frame[zstandard.frame_header_size(frame):]
    tracemalloc.start()
    try:
        with pytest.raises(Refused, match="decompresses to more than the 2000 bytes"):
            decompress(0xC0, lying, 2000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


# --------------------------------------------------------------------------- the real node


def _source(rabbit_node, name: str) -> RabbitSource:
    return RabbitSource(uri=rabbit_node.stream_uri, streams=(name,))


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_real_producers_of_every_codec(rabbit_node, stream):
    name = stream()
    expected: list[tuple[str, bytes]] = []
    entries: list = []
    for kind in KINDS:
        recs = _records(kind.name, 30)
        entries += [(kind, recs), (f"{kind.name}-plain", b"p")]
        expected += [*recs, (f"{kind.name}-plain", b"p")]
    se.produce(rabbit_node.stream_port, name, entries)
    rows = [r for b in RabbitRangeReader(_source(rabbit_node, name), timeout=5).read(
        PartitionRange(name, 0, len(expected)), 50) for r in b.to_pylist()]
    assert collections.Counter(r["key"].decode() for r in rows) == collections.Counter(k for k, _ in expected)
    assert [(r["key"].decode(), r["value"]) for r in rows] == expected
    assert [r["offset"] for r in rows] == list(range(len(expected)))


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_real_undecodable_entries_become_dead_letters_and_reading_goes_on(rabbit_node, stream):
    """A corrupt zstd sub-entry, one of an unknown codec and two gzip bombs (one honest
    about its 512 MiB, one claiming 1 KiB), published between good records."""
    name = stream()
    bomb = se.gzip_of_zeros(512 << 20)
    entries = [
        ("k0", b"v0"),
        se.Forged(code=4, payload=b"\x28\xb5\x2f\xfd corrupt", declared=100, count=3),
        (CompressionType.Lz4, _records("lz", 5)),
        se.Forged(code=6, payload=b"whatever", declared=8, count=2),
        se.Forged(code=1, payload=bomb, declared=512 << 20, count=1),
        se.Forged(code=1, payload=bomb, declared=1024, count=4),
        ("k1", b"v1"),
    ]
    se.produce(rabbit_node.stream_port, name, entries)
    batches = list(RabbitRangeReader(_source(rabbit_node, name), timeout=5).read(PartitionRange(name, 0, 17)))
    rows = [r for b in batches if "reason" not in b.schema.names for r in b.to_pylist()]
    dead = sorted((r for b in batches if "reason" in b.schema.names for r in b.to_pylist()),
                  key=lambda r: r["offset"])
    assert [(r["offset"], r["key"].decode()) for r in rows] == (
        [(0, "k0")] + [(4 + i, f"lz{i:04d}") for i in range(5)] + [(16, "k1")])
    assert [d["offset"] for d in dead] == [1, 2, 3, 9, 10, 11, 12, 13, 14, 15]
    reasons = {d["offset"]: d["reason"] for d in dead}
    assert reasons[1].startswith("undecodable sub-entry (zstd) at offsets [1, 4): zstd: ")
    assert reasons[9].startswith("undecodable sub-entry (unknown codec 6) at offsets [9, 11): ")
    assert reasons[11] == ("undecodable sub-entry (gzip) at offsets [11, 12): its header declares "
                           f"{512 << 20} bytes uncompressed, more than the {MAX_SUB_ENTRY_BYTES} "
                           "one sub-entry may hold")
    assert reasons[12] == ("undecodable sub-entry (gzip) at offsets [12, 16): gzip data decompresses "
                           "to more than the 1024 bytes its header declares")
