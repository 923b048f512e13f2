"""The numpy bulk reader (``formats.avroflat``) against the reference, fastavro record by
record: whatever the bytes (good records at each type's edges, then the same bodies
truncated, extended, with a byte flipped or replaced), a group decoded in bulk gives
exactly the values and dead-letter reasons of the per-record path, and the same rows and
dead letters whatever points a batch is cut at."""

from __future__ import annotations

import json
import math
import random

import pyarrow as pa
import pytest

from reconciler.model import DataSchema, Dimension
from reconciler.pipeline.formats import avro as avro_mod
from reconciler.pipeline.formats import avroflat
from reconciler.pipeline.formats.avro import BULK_MIN, AvroDecoder
from reconciler.pipeline.transform import Transformer
from tests.pipeline.test_formats_avro_cases import EVERY, _every
from tests.pipeline.test_typed_tables import T0, avro_body, records


def _mangle(rnd: random.Random, body: bytes) -> bytes:
    """One body spoiled in one of the ways a stream delivers it."""
    how = rnd.randrange(7)
    if how == 0 or not body:
        return body[:rnd.randrange(len(body) + 1)]  # truncated (or empty)
    if how == 1:
        return body + bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))  # overlong
    i = rnd.randrange(len(body))
    if how == 2:
        return body[:i] + bytes([body[i] ^ (1 << rnd.randrange(8))]) + body[i + 1:]  # a bit flipped
    if how == 3:
        return body[:i] + bytes([rnd.choice([0x80, 0xFF, 0x7F, 0x01, 0x02, 0x03, 0xC3, 0xED])]) + body[i + 1:]
    if how == 4:
        return body[:i] + b"\x80\x00" + body[i:]  # a longer encoding of a small number, or garbage
    if how == 5:  # a varint of more than 64 bits
        return body[:i] + b"\xff" * rnd.randint(9, 11) + bytes([rnd.randint(1, 127)]) + body[i:]
    return body[:i] + b"\xed\xa0\x80" + body[i:]  # a surrogate: not UTF-8


def _same(a: pa.Array, b: pa.Array) -> bool:
    """Equal values, a NaN equal to a NaN (a flipped bit makes some)."""
    if a.type != b.type or len(a) != len(b):
        return False
    for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True):
        if x != y and not (isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys() and all(
                u == v or (isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v))
                for u, v in zip(x.values(), y.values(), strict=True))):
            return False
    return True


@pytest.mark.parametrize("seed", range(6))
def test_bulk_gives_the_per_record_paths_values_and_reasons_for_any_bytes(seed):
    rnd = random.Random(seed)
    good = [avro_body(EVERY, _every(rnd)) for _ in range(400)]
    bodies = [_mangle(rnd, b) if rnd.random() < 0.5 else b for b in good]
    decoder = AvroDecoder(7, json.dumps(EVERY))
    array = pa.array([b"x", *bodies], pa.binary()).slice(1)  # an offset into its buffers, as a task's slices have
    _, ok = avroflat.decode(array, decoder.steps, decoder.type)  # the bulk reader takes any bytes
    assert 200 < ok.sum() < len(bodies)
    values, reasons = decoder.decode(array)
    reference, why = decoder.per_record(bodies)
    assert reasons == why
    assert _same(values, reference)
    assert sum(r is None for r in reasons) > 200 and sum(r is not None for r in reasons) > 20


def test_the_bulk_path_judges_alone_only_the_bodies_it_cannot_read_exactly():
    rnd = random.Random(9)
    bodies = [avro_body(EVERY, _every(rnd)) for _ in range(300)]
    bodies[5] = bodies[5][:3]
    bodies[17] = bodies[17] + b"\x00"
    decoder = AvroDecoder(0, json.dumps(EVERY))
    judged: list[bytes] = []
    alone = decoder.per_record
    decoder.per_record = lambda b: (judged.extend(b), alone(b))[1]  # type: ignore[method-assign]
    values, reasons = decoder.decode(pa.array(bodies, pa.binary()))
    assert judged == [bodies[5], bodies[17]]
    assert reasons[5].startswith("truncated body") and reasons[17] is None  # fastavro reads one record of it
    reference, _ = alone([bodies[17][:-1]])
    assert values[17].as_py() == reference[0].as_py()


FLAT = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "country", "type": ["null", "string"]}, {"name": "amount", "type": "double"},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]}]}


def _order(rnd: random.Random, i: int) -> bytes:
    body = avro_body(FLAT, {"id": i, "ts": T0 + i, "country": rnd.choice([None, "DE", "ünï"]),
                            "amount": i / 4, "day": rnd.choice([None, 0, 19_000, 2_932_896])})
    return _mangle(rnd, body) if rnd.random() < 0.15 else body


def _transform(tmp_path, parts: list[list[bytes | None]]) -> tuple[pa.Table, pa.Table]:
    """The rows and dead letters of one task that reads ``parts`` one after another."""
    ds = DataSchema("orders", "ts", format="avro", dimensions=("id", "country", "amount", "day", "__offset"),
                    typed=(Dimension("id", "long", ("id",)), Dimension("country", "string", ("country",)),
                           Dimension("amount", "double", ("amount",)), Dimension("day", "string", ("day",)),
                           Dimension("__offset", "string", ("__offset",))),
                    format_options={"schemaFile": "o.avsc"})
    t = Transformer(ds, base_dir=str(tmp_path))
    rows, dead, start = [], [], 0
    for part in parts:
        batch = records(part)
        batch = batch.set_column(1, "offset", pa.array(range(start, start + len(part)), pa.int64()))
        out = t(batch)
        rows.append(out.rows)
        dead.append(out.dead)
        start += len(part)
    return pa.concat_tables(rows), pa.concat_tables(dead)


@pytest.mark.parametrize("seed", range(4))
def test_the_same_records_cut_at_any_points_give_the_same_rows_and_dead_letters(tmp_path, seed):
    (tmp_path / "o.avsc").write_text(json.dumps(FLAT))
    rnd = random.Random(seed)
    values: list[bytes | None] = [_order(rnd, i) for i in range(3 * BULK_MIN + 40)]
    values[rnd.randrange(len(values))] = None  # a tombstone
    whole_rows, whole_dead = _transform(tmp_path, [values])
    cuts = sorted(rnd.sample(range(1, len(values)), 5))
    bounds = [0, *cuts, len(values)]
    rows, dead = _transform(tmp_path, [values[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
    assert rows.equals(whole_rows)
    assert dead.equals(whole_dead)
    assert whole_rows.num_rows > len(values) // 2 and whole_dead.num_rows > 10


def test_the_bulk_path_serves_groups_from_bulk_min(monkeypatch):
    # small groups go record by record (fixed costs), bigger ones in bulk
    decoder = AvroDecoder(0, json.dumps(FLAT))
    bodies = pa.array([avro_body(FLAT, {"id": i, "ts": T0, "country": "DE", "amount": 1.0, "day": None})
                       for i in range(BULK_MIN)], pa.binary())
    calls = []
    monkeypatch.setattr(avro_mod.avroflat, "decode", lambda *a: calls.append(len(a[0])) or (_ for _ in ()).throw(
        RuntimeError("the bulk reader failed")))
    for n in (BULK_MIN - 1, BULK_MIN):
        values, reasons = decoder.decode(bodies.slice(0, n))
        assert reasons == [None] * n and values.field("id").to_pylist() == list(range(n))  # a bulk failure falls back
    assert calls == [BULK_MIN]
