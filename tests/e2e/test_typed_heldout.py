"""Issue 42's held-out check, done as a user does it: spec files in a directory,
`reconciler validate` and `reconciler run --until-caught-up` as separate processes,
`reconciler status -o json`, and the tables read through pyiceberg's own ``SqlCatalog``
on our database (not the product's catalog adapter).

Avro from the registry (confluent-kafka's ``AvroSerializer`` against devservices/registry.py)
with ``schemaDiscovery``; a v2 writer schema that adds a field; bad records (no magic
byte, an unknown schema id, a truncated body) dead-lettered and counted as ``unparseable``;
typed JSON with a nested path beside it; and `validate` refusing a missing schema file by
file, line and field. Every good key lands exactly once.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

import devservices
from tests.e2e import helpers as h
from tests.e2e.test_typed_formats import V1, V2, avro_records, order, registry  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

T0 = devservices.DEFAULT_TS_START_MS
VIRTUAL = ["__key", "__partition", "__offset"]
NO_ROLLUP = {"segment": "hour", "query": "none", "rollup": False}


def _catalog(s):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("reconciler", uri=s.db_url, warehouse=Path(s.warehouse).absolute().as_uri())


def _table(s, name: str):
    return _catalog(s).load_table(f"default.{name}")


def _rows(s, name: str) -> list[dict]:
    return _table(s, name).scan().to_arrow().to_pylist()


def _exactly_once(rows: list[dict], expected: list[str]) -> None:
    counts = collections.Counter(r["id"] for r in rows)
    assert sorted(counts) == sorted(expected), (set(expected) ^ set(counts))
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1][:5]


def _run(s) -> None:
    done = h.run_subprocess(s, "run", "--until-caught-up", timeout=420)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def _status(s) -> dict[str, dict]:
    done = h.run_subprocess(s, "status", "-o", "json", "--no-lag")
    assert done.returncode == 0, done.stderr
    return {st["id"]: st for st in json.loads(done.stdout)["supervisors"]}


def _json_records(n: int, start: int = 0) -> list[tuple[str, bytes]]:
    out = []
    for i in range(start, start + n):
        v = {"id": f"j{i:06d}", "ts": T0 + i * 1000, "price": i / 4 if i % 2 else i,
             "geo": {"country": "DE" if i % 2 else "FR", "city": f"c{i}"}, "user": f"u{i % 7}"}
        out.append((v["id"], json.dumps(v).encode()))
    return out


def test_the_held_out_scenario(kafka_broker, topic, tmp_path, registry):  # noqa: F811
    s = h.make_settings(tmp_path)
    avro_topic, json_topic = topic(partitions=2), topic(partitions=2)

    v1 = avro_records(registry, avro_topic, V1, [order(i) for i in range(200)])
    body = v1[0][1]
    bad = [("bad000", b"no header at all"),
           ("bad001", b"\x00\x00\x00\x03\xe7" + body[5:]),  # schema id 999: unknown to the registry
           ("bad002", body[:8])]  # truncated inside the body
    devservices.produce_kafka(kafka_broker.bootstrap, avro_topic, v1[:100] + bad + v1[100:])
    shop = _json_records(150)
    devservices.produce_kafka(kafka_broker.bootstrap, json_topic, shop)

    orders = h.spec_doc("orders", h.kafka_source(kafka_broker.bootstrap, avro_topic), dimensions=VIRTUAL,
                        metrics=[{"name": "n", "type": "count"}], granularity=NO_ROLLUP)
    orders["dataSchema"].update(format="avro", avro={"schemaRegistry": {"url": registry.url}},
                                schemaDiscovery=True)
    h.write_spec(s.specs, orders)
    shops = h.spec_doc("shop", h.kafka_source(kafka_broker.bootstrap, json_topic),
                       dimensions=["id", "user", {"name": "price", "type": "double"},
                                   {"name": "country", "path": "geo.country"}, *VIRTUAL],
                       metrics=[{"name": "n", "type": "count"}], granularity=NO_ROLLUP)
    h.write_spec(s.specs, shops)

    done = h.run_subprocess(s, "validate")
    assert done.returncode == 0, done.stdout + done.stderr
    _run(s)

    # Avro with discovery: the writer schema's types, read through the catalog
    schema = _table(s, "orders").schema()
    types = {f.name: str(f.field_type) for f in schema.fields}
    assert {c: types.get(c) for c in ("id", "qty", "price", "country", "__time")} == {
        "id": "string", "qty": "int", "price": "double", "country": "string", "__time": "timestamptz"}, types
    assert types["geo"].startswith("struct<") and "city" in types["geo"], types
    rows = _rows(s, "orders")
    _exactly_once(rows, h.keys(v1))
    by_id = {r["id"]: r for r in rows}
    assert (by_id["k000007"]["qty"], by_id["k000007"]["price"], by_id["k000007"]["country"],
            by_id["k000007"]["geo"]) == (7, 1.75, "DE", {"city": "c2"})
    assert by_id["k000009"]["country"] is None

    # bad records: dead letters with their reasons, counted in status
    letters = _rows(s, "orders_deadletter")
    reasons = " | ".join(r["reason"] for r in letters)
    assert len(letters) == 3 and "magic byte" in reasons and "999" in reasons and "truncated" in reasons, reasons
    status = _status(s)
    assert status["orders"]["unparseable"] == 3, status["orders"]

    # typed JSON with a nested path
    types = {f.name: str(f.field_type) for f in _table(s, "shop").schema().fields}
    assert (types["price"], types["country"], types["user"]) == ("double", "string", "string"), types
    rows = _rows(s, "shop")
    _exactly_once(rows, h.keys(shop))
    by_id = {r["id"]: r for r in rows}
    assert (by_id["j000003"]["price"], by_id["j000003"]["country"]) == (0.75, "DE")
    assert (by_id["j000004"]["price"], by_id["j000004"]["country"]) == (4.0, "FR")
    assert status["shop"]["unparseable"] == 0, status["shop"]

    # v2 adds a field: an optional column, null in the old rows
    v2 = avro_records(registry, avro_topic, V2, [order(i, V2) for i in range(200, 300)])
    devservices.produce_kafka(kafka_broker.bootstrap, avro_topic, v2)
    _run(s)
    schema = _table(s, "orders").schema()
    assert str(schema.find_field("channel").field_type) == "string" and not schema.find_field("channel").required
    rows = _rows(s, "orders")
    _exactly_once(rows, h.keys(v1 + v2))
    by_id = {r["id"]: r for r in rows}
    assert all(by_id[k]["channel"] is None for k in h.keys(v1))
    assert (by_id["k000201"]["channel"], by_id["k000202"]["channel"]) == ("app", "web")
    assert _status(s)["orders"]["unparseable"] == 3


def test_validate_refuses_a_missing_schema_file(tmp_path):
    s = h.make_settings(tmp_path)
    doc = h.spec_doc("files", h.kafka_source("127.0.0.1:9", "t"), dimensions=["id", *VIRTUAL])
    doc["dataSchema"].update(format="avro", avro={"schemaFile": "schemas/orders.avsc"})
    path = h.write_spec(s.specs, doc)
    line = next(n for n, x in enumerate(path.read_text().splitlines(), 1) if "schemaFile" in x)

    done = h.run_subprocess(s, "validate", s.specs)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert f"{path}:{line}:" in out and "dataSchema.avro.schemaFile" in out and "orders.avsc" in out, out


RICH = {"type": "record", "name": "Rich", "namespace": "acme", "fields": [
    {"name": "id", "type": "string"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "i", "type": "int"}, {"name": "l", "type": "long"}, {"name": "f", "type": "float"},
    {"name": "d", "type": "double"}, {"name": "b", "type": "boolean"}, {"name": "raw", "type": "bytes"},
    {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
    {"name": "arr", "type": {"type": "array", "items": "long"}},
    {"name": "m", "type": {"type": "map", "values": "string"}},
    {"name": "opt", "type": ["null", "long"], "default": None},
    {"name": "either", "type": ["null", "long", "string"], "default": None},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
]}


def test_avro_discovery_maps_every_type_as_the_issue_lists(kafka_broker, topic, tmp_path, registry):  # noqa: F811
    import datetime as dt
    import decimal
    import uuid

    name = topic(partitions=1)
    when = dt.datetime(2026, 11, 28, 7, 0, tzinfo=dt.timezone.utc)
    rows = [{"id": f"r{i}", "ts": when + dt.timedelta(seconds=i), "i": i, "l": 2**40 + i, "f": 0.5, "d": i / 4,
             "b": i % 2 == 0, "raw": b"\x00\x01", "fx": b"abcd", "e": "B", "arr": [i, i + 1], "m": {"k": "v"},
             "opt": None if i % 2 else i, "either": "s" if i % 2 else i, "day": dt.date(2026, 11, 28),
             "tm": dt.time(7, 30), "tsu": when, "lts": dt.datetime(2026, 11, 28, 7, 0),
             "dec": decimal.Decimal("12.34"), "u": str(uuid.UUID(int=i))} for i in range(20)]
    devservices.produce_kafka(kafka_broker.bootstrap, name, avro_records(registry, name, RICH, rows))
    s = h.make_settings(tmp_path)
    doc = h.spec_doc("rich", h.kafka_source(kafka_broker.bootstrap, name), dimensions=VIRTUAL,
                     metrics=[{"name": "n", "type": "count"}], granularity=NO_ROLLUP)
    doc["dataSchema"].update(format="avro", avro={"schemaRegistry": {"url": registry.url}}, schemaDiscovery=True)
    h.write_spec(s.specs, doc)
    _run(s)

    types = {f.name: str(f.field_type) for f in _table(s, "rich").schema().fields}
    expected = {"i": "int", "l": "long", "f": "float", "d": "double", "b": "boolean", "raw": "binary",
                "e": "string", "day": "date", "tm": "time", "tsu": "timestamptz", "lts": "timestamp",
                "dec": "decimal(10, 2)", "u": "string"}  # uuid: its canonical text (docs/spec.md)
    assert {k: types.get(k) for k in expected} == expected, types
    assert types["fx"] in ("fixed[4]", "binary") and types["arr"].startswith("list<") and types["m"].startswith("map<")
    assert types["opt"] == "long" and types["either"].startswith("struct<"), types
    [r] = [r for r in _rows(s, "rich") if r["id"] == "r3"]
    assert (r["i"], r["l"], r["e"], r["arr"], r["opt"], r["day"], r["dec"]) == (
        3, 2**40 + 3, "B", [3, 4], None, dt.date(2026, 11, 28), decimal.Decimal("12.34"))
    assert _status(s)["rich"]["unparseable"] == 0
