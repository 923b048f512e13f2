"""An undecodable RabbitMQ sub-entry's dead letters and ``deadletter replay``: no spec
brings them back, so a replay leaves them, reason and all, and says so (review of
d395f05 / 3ff3c90, issue 41.4). The letters are made by the real reader (``Columns``):
a change of its reason text that the replay no longer recognises fails here."""

from __future__ import annotations

import zlib

import pyarrow as pa
from rstream import schema

from reconciler.model import DataSchema
from reconciler.pipeline.transform import DEAD_SCHEMA
from reconciler.streams.rabbitmq.arrow import Columns
from reconciler.table.deadletters import UNDECODABLE_WHY, DeadFile, listing
from reconciler.table.replay import _parse
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


CORRUPT = _sub_entry(4, 4, 100, b"\x28\xb5\x2f\xfd corrupt zstd")  # offsets 101..104


# --------------------------------------------------------------------------- deadletter replay


def test_deadletter_replay_keeps_the_reason_of_an_undecodable_sub_entry():
    """``deadletter replay D`` (no --reason: e.g. after fixing a timestamp format) parsed
    every dead letter again as a record value. The undecodable sub-entry's letters are not
    record values: the first (the entry's bytes) failed as ``invalid JSON``, the others as
    ``null value``, and the file was rewritten with those reasons: the reason naming the
    entry, its codec and its offset range was gone, and ``--reason 'undecodable'`` no
    longer found them."""
    frame = _frame([_entry("p0", b"before"), CORRUPT], 5)
    cols = Columns("s")
    cols.add_chunk(frame, 100, 105)
    rows = pa.Table.from_batches([cols.dead_batch()]).cast(DEAD_SCHEMA)
    before = rows.column("reason").to_pylist()
    assert all(r.startswith("undecodable sub-entry (zstd) at offsets [101, 105)") for r in before)

    parsed = _parse(DeadFile(task=None, supervisor="s", rows=rows), _Spec(), None)
    assert parsed.replayed == []
    after = parsed.kept.sort_by("offset").column("reason").to_pylist()
    assert after == before, after
    assert not parsed.changed and parsed.left == [UNDECODABLE_WHY] * 4


class _Spec:
    data_schema = DataSchema(datasource="d", timestamp_column="ts")


def _letters() -> pa.Table:
    """The four letters of CORRUPT (its bytes on offset 101) and a record whose timestamp
    the spec could not parse, at offset 100, in one file."""
    cols = Columns("s")
    cols.add_chunk(_frame([_entry("p0", b"before"), CORRUPT], 5), 100, 105)
    rows = pa.Table.from_batches([cols.dead_batch()]).cast(DEAD_SCHEMA)
    fixable = pa.table({"partition": ["s"], "offset": pa.array([100], pa.int64()), "key": pa.array([b"p0"]),
                        "value": pa.array([b'{"ts":"2026-11-20T10:00:00Z"}']),
                        "reason": ["unparseable timestamp (millis): 2026-11-20T10:00:00Z"]}).cast(DEAD_SCHEMA)
    return pa.concat_tables([fixable, rows])


def test_a_replay_selecting_them_by_reason_leaves_them_and_brings_the_others_back():
    rows = _letters()
    f = DeadFile(task=None, supervisor="s", rows=rows)
    parsed = _parse(f, _Spec(), "undecodable")
    assert parsed.replayed == [] and not parsed.changed and parsed.left == [UNDECODABLE_WHY] * 4
    parsed = _parse(f, _Spec(), None)  # the fixable one comes back beside them, they stay as they were
    assert parsed.replayed == [("s", 100)] and parsed.changed
    assert parsed.kept.equals(rows.slice(1)), parsed.kept
    assert parsed.kept.column("value").to_pylist()[0] == rows.column("value").to_pylist()[1]  # the entry's bytes


def test_list_says_they_cannot_come_back():
    doc = listing("d", [DeadFile(task=None, supervisor="s", rows=_letters())], 0, schemas={"s": _Spec.data_schema})
    assert doc["deadLetters"] == 5
    assert doc["cannotComeBack"] == [{"why": UNDECODABLE_WHY, "count": 4}]
