"""Issue 42's Avro bulk path (numpy over a group's bodies, groups of
BULK_MIN records or more) against the per-record path (fastavro, smaller groups): the same
record must give the same row or dead letter whichever path its group takes."""

from __future__ import annotations

import datetime as dt
import json
import random

import pyarrow as pa
import pytest

from reconciler.model import DataSchema
from reconciler.pipeline import batch
from reconciler.pipeline.formats.avro import BULK_MIN, AvroDecoder
from reconciler.pipeline.transform import Transformer
from tests.pipeline.test_typed_tables import SCHEMA, T0, avro_body, records

WITH_DAY = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "day", "type": {"type": "int", "logicalType": "date"}},
                                 {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}


def _transform(tmp_path, schema, values):
    (tmp_path / "o.avsc").write_text(json.dumps(schema))
    ds = DataSchema("orders", "ts", format="avro", dimensions=("country",), schema_discovery=True,
                    format_options={"schemaFile": "o.avsc"})
    return Transformer(ds, base_dir=str(tmp_path))(records(values))


def _fate(out, offset):
    """'dead' or the row's values (ints for time types) of the record at ``offset``."""
    if offset in out.dead.column("offset").to_pylist():
        return "dead"
    rows = out.rows.filter(pa.compute.equal(out.rows.column("id"), offset))
    assert rows.num_rows == 1, rows
    return {c: (rows.column(c).cast(pa.int64()) if pa.types.is_timestamp(rows.schema.field(c).type)
                else rows.column(c).cast(pa.int32()) if pa.types.is_date(rows.schema.field(c).type)
                else rows.column(c)).to_pylist()[0] for c in ("id", "country", "day", "seen")}


def _good(i):
    return avro_body(WITH_DAY, {"id": i, "ts": T0, "country": "DE", "day": 19_000, "seen": T0 * 1000})


def test_an_empty_body_is_a_dead_letter_in_a_big_group_not_its_neighbours_values(tmp_path):
    # An empty body (a producer's bug; in the wire format, the 5-byte header alone) is a
    # dead letter ("truncated body") record by record. In a group of >= BULK_MIN the
    # container block of length 0 is read by DuckDB as ... the previous record again: the
    # row of offset 10 silently holds offset 9's id, country, day.
    values = [_good(i) for i in range(BULK_MIN + 10)]
    values[10] = b""
    small = _transform(tmp_path, WITH_DAY, values[:20])
    assert _fate(small, 10) == "dead"
    big = _transform(tmp_path, WITH_DAY, values)
    assert big.rows.num_rows + big.dead.num_rows == len(values)
    assert 10 in big.dead.column("offset").to_pylist(), big.rows.column("id").to_pylist()[8:12]


def _with(i, **changes):
    rec = {"id": i, "ts": T0, "country": "DE", "day": 19_000, "seen": T0 * 1000, **changes}
    return avro_body(WITH_DAY, rec)


def test_a_date_beyond_year_9999_has_one_fate_whatever_its_group_size(tmp_path):
    # day = 3,000,000 (year 10183): fastavro raises -> dead letter in a small group;
    # DuckDB reads it -> a row with that date in a big one.
    odd = _with(5, day=3_000_000)
    small = _transform(tmp_path, WITH_DAY, [_good(i) for i in range(5)] + [odd])
    big = _transform(tmp_path, WITH_DAY, [_good(i) for i in range(5)] + [odd]
                     + [_good(i) for i in range(6, BULK_MIN + 6)])
    assert _fate(big, 5) == _fate(small, 5)


def test_a_timestamp_beyond_year_9999_has_one_fate_whatever_its_group_size(tmp_path):
    odd = _with(5, seen=2**62)  # timestamp-micros, year ~148,000
    small = _transform(tmp_path, WITH_DAY, [_good(i) for i in range(5)] + [odd])
    big = _transform(tmp_path, WITH_DAY, [_good(i) for i in range(5)] + [odd]
                     + [_good(i) for i in range(6, BULK_MIN + 6)])
    assert _fate(big, 5) == _fate(small, 5)


PLAIN_TS = {"type": "record", "name": "P", "fields": [
    {"name": "id", "type": "long"}, {"name": "ts", "type": "long"}, {"name": "country", "type": "string"}]}


def test_an_avro_long_under_a_timestamp_dimension_is_the_instant_the_row_time_reads(tmp_path):
    # ts: a plain Avro long of millis, declared {name: ts, type: timestamp}. __time reads it
    # by the timestamp type's rule (a number as millis: 2023-11-14); the ts column casts the
    # long to timestamp[us] as MICROseconds: 1970-01-20, silently, in the same row.
    from reconciler.model import Dimension

    (tmp_path / "p.avsc").write_text(json.dumps(PLAIN_TS))
    ds = DataSchema("orders", "ts", timestamp_format="millis", format="avro", dimensions=("ts", "country"),
                    typed=(Dimension("ts", "timestamp", ("ts",)), Dimension("country", "string", ("country",))),
                    format_options={"schemaFile": "p.avsc"})
    out = Transformer(ds, base_dir=str(tmp_path))(records([avro_body(PLAIN_TS, {"id": 1, "ts": T0, "country": "DE"})]))
    assert out.dead.num_rows == 0
    assert out.rows.column("__time").cast(pa.int64()).to_pylist() == [T0 * 1000]
    assert out.rows.column("ts").cast(pa.int64()).to_pylist() == [T0 * 1000]


def test_a_timestamp_dimension_reads_a_number_of_seconds_by_the_auto_rule_too(tmp_path):
    # the same rule as text and as __time: a number of seconds (not taken as micros)
    from reconciler.model import Dimension

    (tmp_path / "p.avsc").write_text(json.dumps(PLAIN_TS))
    ds = DataSchema("orders", "id", timestamp_format="millis", format="avro", dimensions=("ts", "country"),
                    typed=(Dimension("ts", "timestamp", ("ts",)), Dimension("country", "string", ("country",))),
                    format_options={"schemaFile": "p.avsc"})
    out = Transformer(ds, base_dir=str(tmp_path))(records([avro_body(PLAIN_TS, {"id": T0, "ts": T0 // 1000,
                                                                                "country": "DE"})]))
    assert out.dead.num_rows == 0
    assert out.rows.column("ts").cast(pa.int64()).to_pylist() == [T0 * 1000]


EVERY = {"type": "record", "name": "R", "fields": [
    {"name": "a", "type": "long"}, {"name": "b", "type": "int"}, {"name": "c", "type": ["null", "string"]},
    {"name": "d", "type": ["double", "null"]}, {"name": "e", "type": "float"}, {"name": "f", "type": "boolean"},
    {"name": "g", "type": "bytes"}, {"name": "h", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "i", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "j", "type": ["null", {"type": "int", "logicalType": "date"}]}]}
UTC0 = dt.datetime(1, 1, 1, tzinfo=dt.UTC)


def _every(rnd: random.Random) -> dict:
    return {"a": rnd.choice([0, -1, 63, 64, -64, -65, 2**62, -2**63, 2**63 - 1, rnd.randint(-10**12, 10**12)]),
            "b": rnd.choice([0, -2**31, 2**31 - 1, rnd.randint(-1000, 1000)]),
            "c": rnd.choice([None, "", "é" * rnd.randint(0, 200)]), "d": rnd.choice([None, 1.5, -0.0]),
            "e": 2.5, "f": rnd.random() < .5, "g": bytes(rnd.randint(0, 300)),
            "h": UTC0 + dt.timedelta(milliseconds=rnd.randint(0, 315537897599999)),
            "i": UTC0 + dt.timedelta(microseconds=rnd.randint(0, 315537897599999999)),
            "j": rnd.choice([None, dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1969, 12, 31)])}


def test_the_bulk_path_keeps_every_well_formed_record_and_reads_it_as_the_per_record_path():
    # the checks that send a record to the per-record path (its length re-encoded, its
    # dates within years 1..9999) pass every well-formed body, at the edges of each type
    rnd = random.Random(1)
    bodies = pa.array([avro_body(EVERY, _every(rnd)) for _ in range(1000)], pa.binary())
    decoder = AvroDecoder(0, json.dumps(EVERY))
    reference, _ = decoder.per_record(bodies.to_pylist())
    judged = []
    decoder.per_record = lambda b: judged.append(len(b))  # type: ignore[method-assign]
    values, reasons = decoder.decode(bodies)
    assert judged == [] and reasons == [None] * 1000
    assert values.equals(reference)


@pytest.mark.parametrize("cut", [1, 5, 12, -1])
def test_a_truncated_or_overlong_body_has_one_fate_whatever_its_group_size(tmp_path, cut):
    body = _good(10)
    values = [_good(i) for i in range(BULK_MIN + 10)]
    values[10] = body[:cut] if cut > 0 else body + b"\x00\x01"  # fastavro reads one record of it
    small = _transform(tmp_path, WITH_DAY, values[:20])
    big = _transform(tmp_path, WITH_DAY, values)
    assert _fate(big, 10) == _fate(small, 10)
    assert _fate(big, 9)["id"] == 9 and _fate(big, 11)["id"] == 11


def test_tasks_that_met_a_field_as_int_and_as_long_take_the_promotion():
    declared = pa.schema([("__time", pa.timestamp("us", tz="UTC"))])
    merged = batch.discovered_schema(declared, [
        pa.schema([("n", pa.int64()), ("x", pa.float32()), ("m", pa.decimal128(10, 2))]),
        pa.schema([("n", pa.int32()), ("x", pa.float64()), ("m", pa.decimal128(12, 2))]),
        pa.schema([("n", pa.int32())])])
    assert [(f.name, f.type) for f in merged][1:] == [
        ("n", pa.int64()), ("x", pa.float64()), ("m", pa.decimal128(12, 2))]
    # two scales: no promotion between them, both flat: a string column (the batch is run again)
    assert batch.discovered_schema(declared, [pa.schema([("m", pa.decimal128(10, 2))]),
                                              pa.schema([("m", pa.decimal128(12, 3))])]).field("m").type == pa.string()
