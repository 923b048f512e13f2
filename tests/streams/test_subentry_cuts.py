"""Sub-entry batches (issue 41.4) cut by range boundaries and chunks full of sub-entries:
the same offsets give the same rows and dead letters wherever ranges cut, an entry's
bytes are kept once, and what is held decompressed is about one sub-entry and one batch.

First written as a review of d395f05 / 3ff3c90: each side of a range boundary inside an
undecodable sub-entry carried the entry's bytes; a chunk of six zstd sub-entries of
12 KiB on the wire, each inflating to 64 MiB, was held whole (448 MiB); a level-22
streamed zstd frame (128 MiB window) was refused by the decoder's window limit.
"""

from __future__ import annotations

import collections
import itertools
import tracemalloc
import zlib

import pytest
from rstream import schema

from reconciler.model import PartitionRange, RabbitSource
from reconciler.streams.rabbitmq import RabbitRangeReader
from reconciler.streams.rabbitmq.arrow import Columns
from reconciler.streams.rabbitmq.codecs import MAX_SUB_ENTRY_BYTES
from tests.streams import subentries as se


def _sub_entry(code: int, count: int, declared: int, payload: bytes) -> bytes:
    return (bytes([0x80 | code << 4]) + count.to_bytes(2, "big") + declared.to_bytes(4, "big")
            + len(payload).to_bytes(4, "big") + payload)


def _entry(key: str, value: bytes) -> bytes:
    m = bytes(se.message(key, value))
    return len(m).to_bytes(4, "big") + m


def _frame(entries: list[bytes], num_records: int, first: int = 100) -> schema.Deliver:
    data = b"".join(entries)
    return schema.Deliver(subscription_id=0, magic_version=0x50, chunk_type=0, num_entries=len(entries),
                          num_records=num_records, timestamp=1_700_000_000_000, epoch=1,
                          chunk_first_offset=first, chunk_crc=zlib.crc32(data), data_length=len(data),
                          trailer_length=0, _reserved=0, data=data)


def _read(frame: schema.Deliver, cuts: list[int], **limits) -> tuple[list[tuple], list[tuple]]:
    """(records, dead letters) of ``frame`` read as the sub-ranges between ``cuts`` (one
    Columns per sub-range, as one task per range does)."""
    rows, dead = [], []
    for start, end in itertools.pairwise(cuts):
        cols = Columns("s", **limits)
        cols.add_chunk(frame, start, end)
        for b in cols.batches(final=True):
            if "reason" in b.schema.names:
                dead += [(d["offset"], d["value"], d["reason"]) for d in b.to_pylist()]
            else:
                rows += [(r["offset"], r["key"], r["value"]) for r in b.to_pylist()]
    return rows, sorted(dead)


def _dead(frame: schema.Deliver, cuts: list[int]) -> list[tuple[int, bytes | None, str]]:
    return _read(frame, cuts)[1]


CORRUPT = _sub_entry(4, 4, 100, b"\x28\xb5\x2f\xfd corrupt zstd")  # offsets 101..104


@pytest.mark.parametrize("cut", [102, 103, 104], ids=lambda c: f"cut-at-{c}")
def test_an_undecodable_entry_cut_by_a_range_boundary_keeps_its_bytes_once(cut):
    """Offsets 101..104 are one corrupt zstd sub-entry. Read as one range, offset 101 carries
    its bytes and 102..104 None. Read as [100, cut) + [cut, 106) (taskCount 2, a backfill's
    own cuts, a replay), the second range's first dead letter carries the bytes again."""
    frame = _frame([_entry("p0", b"before"), CORRUPT, _entry("p5", b"after")], 6)
    whole = _dead(frame, [100, 106])
    split = _dead(frame, [100, cut, 106])
    assert [o for o, _, _ in whole] == [101, 102, 103, 104]
    assert sum(v is not None for _, v, _ in whole) == 1
    assert [o for o, _, _ in split] == [101, 102, 103, 104]  # holds: each offset once
    # the producer's bytes are kept once, whatever the cut
    assert sum(v is not None for _, v, _ in split) == 1, [
        (o, None if v is None else len(v)) for o, v, _ in split]
    # and the same offsets give the same dead-letter rows
    assert split == whole


def test_an_undecodable_entry_read_from_inside_gives_the_same_rows_as_read_whole():
    """A replay (or a checkpoint) that starts inside the entry: offset 103's dead letter is
    the entry's bytes there and None when the whole entry was read."""
    frame = _frame([_entry("p0", b"before"), CORRUPT], 5)
    whole = {o: v for o, v, _ in _dead(frame, [100, 105])}
    inside = {o: v for o, v, _ in _dead(frame, [103, 105])}
    assert inside == {o: whole[o] for o in (103, 104)}


def _zstd_records(prefix: str, n: int) -> bytes:
    plain = se._plain([se.message(f"{prefix}{i}", b"v%d" % i) for i in range(n)])
    return _sub_entry(4, n, len(plain), se.zstd_streamed(plain))


def test_every_way_of_cutting_a_chunk_gives_the_same_rows_and_dead_letters():
    """Offsets 100..109: a record, a corrupt sub-entry (101..104), a good zstd one
    (105..107), a record, and a chunk header claiming one record more than its entries
    hold (109). Read whole, or cut at any two points, the records and the dead letters
    are the same, and the bytes of each undecodable entry are in one dead letter."""
    frame = _frame([_entry("p0", b"before"), CORRUPT, _zstd_records("z", 3), _entry("p8", b"x")], 10)
    whole = _read(frame, [100, 110])
    assert [o for o, _, _ in whole[0]] == [100, 105, 106, 107, 108]
    assert [o for o, _, _ in whole[1]] == [101, 102, 103, 104, 109]
    assert [o for o, v, _ in whole[1] if v is not None] == [101]
    for a in range(101, 110):
        for b in range(a, 110):
            assert _read(frame, [100, a, b, 110]) == whole, (a, b)


def test_a_sub_entry_of_no_record_holding_bytes_is_reported_once(caplog):
    """Its bytes have no offset to be a dead letter at: a warning naming the chunk, and a
    count, by the one read that holds its position (here between offsets 100 and 101)."""
    empty = _sub_entry(4, 0, 100, b"\x28\xb5\x2f\xfd lost bytes")
    frame = _frame([_entry("p0", b"a"), empty, _sub_entry(0, 0, 0, b""), _entry("p1", b"b"), empty], 2)
    counts = []
    for cuts in ([100, 102], [100, 101, 102]):
        caplog.clear()
        seen = 0
        for start, end in itertools.pairwise(cuts):
            cols = Columns("s")
            cols.add_chunk(frame, start, end)
            assert [b.num_rows for b in cols.batches(final=True)] == [end - start]
            seen += cols.empty_sub_entries
        counts.append(seen)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 2, warnings
        assert all("chunk at offset 100" in w and "holds data but no record" in w for w in warnings)
    assert counts == [2, 2]  # the one between p0 and p1, and the one after p1: not the empty one


def test_batches_are_cut_by_bytes_across_chunks_and_before_a_sub_entry_that_would_overflow():
    """Ten chunks of one sub-entry each (50 records of 10 KiB, 500 KiB): with a budget of
    1 MiB a batch holds two of them, never three (the budget is checked against the next
    sub-entry's declared size before it is decompressed), and every record comes out once."""
    frames = []
    for c in range(10):
        plain = se._plain([se.message(f"c{c}r{i}", bytes(10 << 10)) for i in range(50)])
        frames.append(_frame([_sub_entry(4, 50, len(plain), se.zstd_streamed(plain))], 50, 100 + 50 * c))
    cols = Columns("s", max_rows=10_000, max_bytes=1 << 20)
    sizes, offsets = [], []
    for f in frames:
        cols.add_chunk(f, 100, 600)
        for b in cols.batches():
            sizes.append(b.num_rows)
            offsets += b.column("offset").to_pylist()
    assert sizes == [100] * 4  # the third sub-entry would overflow: the two held go first
    last = list(cols.batches(final=True))  # the last two, under the budget, wait for the end
    assert [b.num_rows for b in last] == [100]
    assert offsets + last[0].column("offset").to_pylist() == list(range(100, 600))


def _zeros_record_zstd(size: int) -> bytes:
    """A sub-entry of one record (not AMQP: taken whole) that inflates to exactly ``size``
    bytes, as a streamed zstd frame of a couple of KiB."""
    import zstandard

    plain_len = size
    c = zstandard.ZstdCompressor(level=3).compressobj()
    head = (plain_len - 4).to_bytes(4, "big")
    block = bytes(1 << 20)
    parts = [c.compress(head)]
    left = plain_len - 4
    while left:
        n = min(left, len(block))
        parts.append(c.compress(block[:n]))
        left -= n
    parts.append(c.flush())
    return _sub_entry(4, 1, plain_len, b"".join(parts))


def test_a_chunk_of_many_sub_entries_just_under_the_bound_is_not_held_all_at_once():
    """Six zstd sub-entries, each one record inflating to the 64 MiB bound: a chunk of
    ~15 KiB on the wire (a publish of 1 MiB holds hundreds). Each is within the bound, and
    so is what is held while the chunk is read: one sub-entry decompressed and one batch
    (the one the consumer still holds), never the chunk's 6 x 64 MiB."""
    one = _zeros_record_zstd(MAX_SUB_ENTRY_BYTES)
    n = 6
    frame = _frame([one] * n + [_entry("after", b"v")], n + 1)
    assert len(frame.data) < 64 << 10
    held = 0
    tracemalloc.start()
    try:
        cols = Columns("s")
        cols.add_chunk(frame, 100, 100 + n + 1)
        for batch in cols.batches(final=True):  # the consumer holds a batch while the next is cut
            assert "reason" not in batch.schema.names
            held += batch.num_rows
        del batch
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del cols
    assert held == n + 1
    assert peak < 2 * MAX_SUB_ENTRY_BYTES + (16 << 20), (
        f"a {len(frame.data)}-byte chunk peaked at {peak >> 20} MiB")


# --------------------------------------------------------------------------- the real node


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_real_node_dead_letters_of_a_sub_entry_split_by_two_tasks(rabbit_node, stream):
    """rstream's Producer writes k0, a corrupt zstd sub-entry of 4 records (offsets 1..4),
    k5. Two tasks read [0, 3) and [3, 6): the entry's bytes come out twice."""
    name = stream()
    se.produce(rabbit_node.stream_port, name, [
        ("k0", b"v0"),
        se.Forged(code=4, payload=b"\x28\xb5\x2f\xfd corrupt", declared=100, count=4),
        ("k5", b"v5"),
    ])
    reader = RabbitRangeReader(RabbitSource(uri=rabbit_node.stream_uri, streams=(name,)), timeout=5)

    def dead(start: int, end: int) -> list[tuple[int, bytes | None]]:
        return [(d["offset"], d["value"]) for b in reader.read(PartitionRange(name, start, end))
                if "reason" in b.schema.names for d in b.to_pylist()]

    whole = sorted(dead(0, 6))
    split = sorted(dead(0, 3) + dead(3, 6))
    assert [o for o, _ in whole] == [o for o, _ in split] == [1, 2, 3, 4]
    carried = collections.Counter(v is not None for _, v in split)
    assert carried[True] == 1, f"the entry's bytes are in {carried[True]} dead letters"
    assert split == whole


# --------------------------------------------------------------------------- zstd window


def test_a_valid_small_zstd_frame_of_a_high_level_is_read_not_dead_lettered():
    """A streamed zstd frame (no content size, as the Java client writes) at level 22
    declares a 128 MiB window; its 1 MiB of records is valid and within every bound the
    README states, but ``max_window_size=64 MiB`` refuses it ("Frame requires too much
    memory"): valid records become dead letters. A one-shot decompress into the declared
    size needs no window buffer at all."""
    import zstandard

    recs = [se.message(f"k{i}", b"v" * 1000) for i in range(1000)]
    plain = se._plain(recs)
    c = zstandard.ZstdCompressor(level=22).compressobj()
    payload = c.compress(plain) + c.flush()
    frame = _frame([_sub_entry(4, len(recs), len(plain), payload)], len(recs))
    rows, dead = _read(frame, [100, 100 + len(recs)])
    assert dead == [], dead[0][2]
    assert len(rows) == len(recs)
