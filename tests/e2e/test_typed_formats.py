"""Typed tables end to end (issue 42): real Tansu, real Spark, the daemon in this process.

Values are produced as producers write them: JSON and CSV as text, Avro and Protobuf by
confluent-kafka's own ``AvroSerializer``/``ProtobufSerializer`` against the minimal
Confluent-compatible registry (devservices/registry.py: no real registry is installable
here), Avro from a schema file by fastavro. Every test that ingests finds each produced
good key exactly once in the table (none missing, none duplicated), reads the column
types through the catalog (pyiceberg's schema of the table) and the values back, and
finds each bad record a dead letter with its reason.
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

import devservices
from devservices.registry import Registry
from reconciler.daemon import Daemon
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

T0 = devservices.DEFAULT_TS_START_MS
VIRTUAL = ["__key", "__partition", "__offset"]
COUNT = [{"name": "n", "type": "count"}]
NO_ROLLUP = {"segment": "hour", "query": "none", "rollup": False}

V1 = {"type": "record", "name": "Order", "namespace": "acme", "fields": [
    {"name": "id", "type": "string"},
    {"name": "ts", "type": "long"},
    {"name": "qty", "type": "int"},
    {"name": "price", "type": "double"},
    {"name": "country", "type": ["null", "string"], "default": None},
    {"name": "geo", "type": {"type": "record", "name": "Geo", "fields": [{"name": "city", "type": "string"}]}},
]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}  # adds a field
V3 = {**V2, "fields": [f if f["name"] != "qty" else {"name": "qty", "type": "long"} for f in V2["fields"]]}
V4 = {**V2, "fields": [f if f["name"] != "qty" else {"name": "qty", "type": "string"} for f in V2["fields"]]}

AVRO_DIMS = ["id", {"name": "qty", "type": "long"}, {"name": "price", "type": "double"}, "country",
             {"name": "city", "path": "geo.city"}, *VIRTUAL]


@pytest.fixture
def registry():
    from reconciler.pipeline.formats import registry as sources

    sources._FETCHED.clear()  # a port reused by a later test's registry must not see cached ids
    with Registry() as reg:
        yield reg
    sources._FETCHED.clear()


def order(i: int, schema: dict = V1, **extra) -> dict:
    o = {"id": f"k{i:06d}", "ts": T0 + i * 1000, "qty": i % 50, "price": i / 4,
         "country": None if i % 3 == 0 else "DE", "geo": {"city": f"c{i % 5}"}, **extra}
    if any(f["name"] == "channel" for f in schema["fields"]):
        o.setdefault("channel", "app" if i % 2 else "web")
    return o


def avro_records(reg: Registry, topic: str, schema: dict, orders: list[dict]) -> list[tuple[str, bytes]]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = AvroSerializer(SchemaRegistryClient({"url": reg.url}), json.dumps(schema))
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [(o["id"], ser(o, ctx)) for o in orders]


def typed_spec(sid: str, kafka_broker, topic: str, fmt: str, dimensions, block: dict | None = None,
               **extra) -> dict:
    ds_extra = {fmt: block} if block is not None else {}
    doc = h.spec_doc(sid, h.kafka_source(kafka_broker.bootstrap, topic), dimensions=dimensions,
                     metrics=COUNT, granularity=NO_ROLLUP)
    doc["dataSchema"].update(format=fmt, **ds_extra, **extra)
    return doc


def table_types(s, name: str) -> dict[str, str]:
    """Each column's Iceberg type, from the table's schema in the catalog."""
    tables = h.open_tables(s)
    try:
        table = tables.load(name)
        assert table is not None, f"no table {name}"
        return {f.name: str(f.field_type) for f in table.schema().fields}
    finally:
        tables.catalog.engine.dispose()


def optional(s, name: str, column: str) -> bool:
    tables = h.open_tables(s)
    try:
        return not tables.load(name).schema().find_field(column).required
    finally:
        tables.catalog.engine.dispose()


def rows_by_id(s, name: str, columns: list[str]) -> dict[str, dict]:
    t = h.table_rows(s, name, ["id", *columns]).to_pylist()
    return {r["id"]: r for r in t}


def status(s, sid: str) -> dict:
    [st] = h.cli_json(s, "status", sid)["supervisors"]
    return st


def test_typed_and_nested_json(spark, kafka_broker, topic, tmp_path):
    """{name: price, type: double}, {name: country, path: geo.country}, long, boolean,
    timestamp and json columns: typed in the catalog, values read back; a misfit
    (qty: "abc" under long) is a dead letter naming the field."""
    name = topic(partitions=2)
    good, bad = [], []
    for i in range(300):
        key = f"k{i:06d}"
        v = {"id": key, "ts": T0 + i * 1000, "price": i / 4, "qty": i, "ok": i % 2 == 0,
             "seen": f"2026-11-28T07:{i % 60:02d}:00Z", "attrs": {"a": i, "b": [1, 2]},
             "geo": {"country": "DE" if i % 2 else "FR", "city": "x"}}
        good.append((key, json.dumps(v).encode()))
    bad.append(("bad000", json.dumps({"id": "bad000", "ts": T0, "qty": "abc", "price": 1}).encode()))
    bad.append(("bad001", json.dumps({"id": "bad001", "ts": T0, "qty": 1, "price": "cheap"}).encode()))
    bad.append(("bad002", b"{not json"))
    devservices.produce_kafka(kafka_broker.bootstrap, name, good + bad)
    s = h.make_settings(tmp_path)
    dims = ["id", {"name": "price", "type": "double"}, {"name": "qty", "type": "long"},
            {"name": "ok", "type": "boolean"}, {"name": "seen", "type": "timestamp"},
            {"name": "attrs", "type": "json"}, {"name": "country", "path": "geo.country"}, *VIRTUAL]
    h.write_spec(s.specs, typed_spec("tjson", kafka_broker, name, "json", dims))

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "tjson"), h.keys(good))
    types = table_types(s, "tjson")
    assert {c: types[c] for c in ("id", "price", "qty", "ok", "seen", "attrs", "country")} == {
        "id": "string", "price": "double", "qty": "long", "ok": "boolean", "seen": "timestamptz",
        "attrs": "string", "country": "string"}
    rows = rows_by_id(s, "tjson", ["price", "qty", "ok", "seen", "attrs", "country"])
    r = rows["k000007"]
    assert (r["price"], r["qty"], r["ok"], r["country"]) == (1.75, 7, False, "DE")
    assert r["seen"].isoformat() == "2026-11-28T07:07:00+00:00"
    assert json.loads(r["attrs"]) == {"a": 7, "b": [1, 2]}
    assert rows["k000008"]["country"] == "FR"

    letters = h.deadletters(spark, s, "tjson")
    assert len(letters) == 3
    reasons = " | ".join(x[2] for x in letters)
    assert "qty" in reasons and "abc" in reasons and "price" in reasons and "JSON" in reasons, reasons
    assert status(s, "tjson")["unparseable"] == 3


def test_csv(spark, kafka_broker, topic, tmp_path):
    """CSV values named by csv.columns, typed by the JSON rules; a row of the wrong width
    and a misfit are dead letters."""
    name = topic(partitions=2)
    good = [(f"k{i:06d}", f"k{i:06d};{T0 + i * 1000};u{i % 7};{i};{i / 2}".encode()) for i in range(400)]
    bad = [("bad000", b"bad000;1;u1"), ("bad001", f"bad001;{T0};u1;many;1.0".encode())]
    devservices.produce_kafka(kafka_broker.bootstrap, name, good + bad)
    s = h.make_settings(tmp_path)
    dims = ["id", "user", {"name": "qty", "type": "long"}, {"name": "price", "type": "double"}, *VIRTUAL]
    h.write_spec(s.specs, typed_spec("tcsv", kafka_broker, name, "csv", dims,
                                     {"columns": ["id", "ts", "user", "qty", "price"], "delimiter": ";"}))

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "tcsv"), h.keys(good))
    types = table_types(s, "tcsv")
    assert (types["qty"], types["price"], types["user"]) == ("long", "double", "string")
    r = rows_by_id(s, "tcsv", ["user", "qty", "price"])["k000013"]
    assert (r["user"], r["qty"], r["price"]) == ("u6", 13, 6.5)
    reasons = [x[2] for x in h.deadletters(spark, s, "tcsv")]
    assert len(reasons) == 2 and any("fields" in x for x in reasons) and any("qty" in x for x in reasons), reasons
    assert status(s, "tcsv")["unparseable"] == 2


def test_avro_from_the_registry(spark, kafka_broker, topic, tmp_path, registry):
    """AvroSerializer's wire format, typed declared dimensions (int widened to long,
    a nested path), through the registry; each writer schema fetched once."""
    name = topic(partitions=3)
    orders = [order(i) for i in range(600)]
    records = avro_records(registry, name, V1, orders)
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, typed_spec("tavro", kafka_broker, name, "avro", AVRO_DIMS,
                                     {"schemaRegistry": {"url": registry.url}}))

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "tavro"), h.keys(records))
    types = table_types(s, "tavro")
    assert {c: types[c] for c in ("qty", "price", "country", "city")} == {
        "qty": "long", "price": "double", "country": "string", "city": "string"}
    rows = rows_by_id(s, "tavro", ["qty", "price", "country", "city"])
    assert rows["k000007"] == {"id": "k000007", "qty": 7, "price": 1.75, "country": "DE", "city": "c2"}
    assert rows["k000009"]["country"] is None
    assert h.deadletters(spark, s, "tavro") == [] and status(s, "tavro")["unparseable"] == 0
    assert registry.requests["GET /schemas/ids/1"] >= 1  # fetched (once per process: cached)


def test_avro_schema_evolution(spark, kafka_broker, topic, tmp_path, registry):
    """v2 adds a field (the spec adds its dimension: the table gains an optional column,
    old rows null); v3 widens qty int -> long (values past 2**31 land); v4 makes qty a
    string: its records are dead letters naming the field while the rest flow."""
    name = topic(partitions=2)
    s = h.make_settings(tmp_path)
    src = {"schemaRegistry": {"url": registry.url}}
    v1 = avro_records(registry, name, V1, [order(i) for i in range(200)])
    devservices.produce_kafka(kafka_broker.bootstrap, name, v1)
    h.write_spec(s.specs, typed_spec("evo", kafka_broker, name, "avro", AVRO_DIMS, src))
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    assert "channel" not in table_types(s, "evo")

    # the spec is applied before v2's records arrive (a spec changed while records wait is
    # test_typed_bugs.py's first test)
    dims2 = [*AVRO_DIMS[:-3], "channel", *VIRTUAL]
    h.write_spec(s.specs, typed_spec("evo", kafka_broker, name, "avro", dims2, src))
    code, text = h.run_cli(s, "plan")
    assert code == 2, text
    assert "evo: + column channel string (optional)" in text, text
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    v2 = avro_records(registry, name, V2, [order(i, V2) for i in range(200, 400)])
    devservices.produce_kafka(kafka_broker.bootstrap, name, v2)
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    types = table_types(s, "evo")
    assert types.get("channel") == "string", types
    assert optional(s, "evo", "channel")

    big = 2**31 + 5
    v3 = avro_records(registry, name, V3, [order(i, V3, qty=big + i) for i in range(400, 500)])
    v4 = avro_records(registry, name, V4, [order(i, V4, qty=str(i)) for i in range(500, 550)])
    mixed = [r for pair in zip(v3[:50], v4, strict=True) for r in pair] + v3[50:]
    devservices.produce_kafka(kafka_broker.bootstrap, name, mixed)
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "evo"), h.keys(v1 + v2 + v3))
    rows = rows_by_id(s, "evo", ["qty", "channel"])
    assert all(rows[k]["channel"] is None for k in h.keys(v1))
    assert rows["k000201"]["channel"] == "app" and rows["k000202"]["channel"] == "web"
    assert rows["k000401"]["qty"] == big + 401
    letters = h.deadletters(spark, s, "evo")
    assert len(letters) == 50
    assert all("qty" in reason and "string" in reason for _, _, reason in letters), letters[:3]
    assert status(s, "evo")["unparseable"] == 50


def test_avro_bad_input(spark, kafka_broker, topic, tmp_path, registry):
    """No magic byte, an unknown schema id, a truncated body: each a dead letter with its
    reason, counted in status' unparseable; the good records land."""
    name = topic(partitions=1)
    good = avro_records(registry, name, V1, [order(i) for i in range(100)])
    body = good[0][1]
    bad = [("bad000", b"plain text, no header"),
           ("bad001", b"\x00\x00\x00\x03\xe7" + body[5:]),  # schema id 999
           ("bad002", body[:9])]
    devservices.produce_kafka(kafka_broker.bootstrap, name, good[:50] + bad + good[50:])
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, typed_spec("bad", kafka_broker, name, "avro", AVRO_DIMS,
                                     {"schemaRegistry": {"url": registry.url}}))
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "bad"), h.keys(good))
    reasons = [r for _, _, r in h.deadletters(spark, s, "bad")]
    assert len(reasons) == 3, reasons
    text = " | ".join(reasons)
    assert "magic byte" in text and "unknown schema id 999" in text and "truncated" in text, text
    assert status(s, "bad")["unparseable"] == 3


def test_protobuf_from_the_registry(spark, kafka_broker, topic, tmp_path, registry):
    import importlib
    import sys

    import grpc_tools
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from grpc_tools import protoc

    out = tmp_path / "proto"
    out.mkdir()
    (out / "e2e_typed_orders.proto").write_text(
        'syntax = "proto3";\npackage e2e;\n'
        "message Geo { string city = 1; }\n"
        "message Order { string id = 1; int64 ts = 2; int32 qty = 3; double price = 4; string country = 5;"
        " Geo geo = 6; }\n")
    include = f"{grpc_tools.__path__[0]}/_proto"
    assert protoc.main(["protoc", f"-I{out}", f"-I{include}", f"--python_out={out}",
                        str(out / "e2e_typed_orders.proto")]) == 0
    sys.path.insert(0, str(out))
    try:
        pb = importlib.import_module("e2e_typed_orders_pb2")
    finally:
        sys.path.remove(str(out))
    name = topic(partitions=2)
    ser = ProtobufSerializer(pb.Order, SchemaRegistryClient({"url": registry.url}), {"use.deprecated.format": False})
    ctx = SerializationContext(name, MessageField.VALUE)
    records = []
    for i in range(300):
        o = order(i)
        msg = pb.Order(id=o["id"], ts=o["ts"], qty=o["qty"], price=o["price"], country=o["country"] or "")
        msg.geo.city = o["geo"]["city"]
        records.append((o["id"], ser(msg, ctx)))
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, typed_spec("tproto", kafka_broker, name, "protobuf", AVRO_DIMS,
                                     {"schemaRegistry": {"url": registry.url}}))
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "tproto"), h.keys(records))
    types = table_types(s, "tproto")
    assert (types["qty"], types["price"], types["city"]) == ("long", "double", "string")
    rows = rows_by_id(s, "tproto", ["qty", "price", "country", "city"])
    assert rows["k000007"] == {"id": "k000007", "qty": 7, "price": 1.75, "country": "DE", "city": "c2"}
    assert status(s, "tproto")["unparseable"] == 0


def test_avro_from_a_schema_file(spark, kafka_broker, topic, tmp_path):
    """avro: {schemaFile: schemas/orders.avsc}, relative to the spec's directory; plain
    Avro bodies (no registry header)."""
    import fastavro

    name = topic(partitions=2)
    s = h.make_settings(tmp_path)
    (Path(s.specs) / "schemas").mkdir(parents=True)
    (Path(s.specs) / "schemas" / "orders.avsc").write_text(json.dumps(V1))
    parsed = fastavro.parse_schema(V1)
    records = []
    for i in range(300):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, order(i))
        records.append((f"k{i:06d}", buf.getvalue()))
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    h.write_spec(s.specs, typed_spec("tfile", kafka_broker, name, "avro", AVRO_DIMS,
                                     {"schemaFile": "schemas/orders.avsc"}))
    code, text = h.run_cli(s, "validate")
    assert code == 0, text
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "tfile"), h.keys(records))
    rows = rows_by_id(s, "tfile", ["qty", "price", "country", "city"])
    assert rows["k000007"] == {"id": "k000007", "qty": 7, "price": 1.75, "country": "DE", "city": "c2"}
    assert table_types(s, "tfile")["qty"] == "long"
    assert status(s, "tfile")["unparseable"] == 0


def test_validate_refuses_a_missing_schema_file(tmp_path):
    s = h.make_settings(tmp_path)
    path = h.write_spec(s.specs, typed_spec("nofile", type("K", (), {"bootstrap": "127.0.0.1:9"}), "t",
                                            "avro", AVRO_DIMS, {"schemaFile": "schemas/missing.avsc"}))
    code, out = h.run_cli(s, "validate", "-o", "json")
    assert code == 1, out
    line = next(n for n, x in enumerate(path.read_text().splitlines(), 1) if "schemaFile" in x)
    [problem] = json.loads(out)["problems"]
    assert (problem["path"], problem["line"], problem["field"]) == (str(path), line, "dataSchema.avro.schemaFile")
    assert "missing.avsc" in problem["message"] and "does not exist" in problem["message"], problem
    done = h.run_subprocess(s, "validate")  # the text a person reads: FILE:LINE:COLUMN: FIELD: MESSAGE
    assert done.returncode == 1, done
    assert f"{path}:{line}:" in done.stdout + done.stderr and "dataSchema.avro.schemaFile" in done.stdout + done.stderr


def test_an_incompatible_type_change_is_refused_and_the_old_spec_keeps_running(spark, kafka_broker, topic,
                                                                                 tmp_path):
    """A string column made long: plan exits 1 with the reason; the daemon keeps the
    spec it runs (its first pass meets the refused spec with nothing to read), and records
    produced after land in the table as before."""
    name = topic(partitions=2)
    first = devservices.make_records(200)
    devservices.produce_kafka(kafka_broker.bootstrap, name, first)
    s = h.make_settings(tmp_path)
    dims = ["id", "user", "page", "bytes", *VIRTUAL]  # bytes as a string column
    doc = typed_spec("refuse", kafka_broker, name, "json", dims)
    h.write_spec(s.specs, doc)
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    assert table_types(s, "refuse")["bytes"] == "string"

    changed = typed_spec("refuse", kafka_broker, name, "json",
                         ["id", "user", "page", {"name": "bytes", "type": "long"}, *VIRTUAL])
    h.write_spec(s.specs, changed)
    code, text = h.run_cli(s, "plan")
    assert code == 1, text
    assert "bytes string -> long: refused" in text and "Iceberg cannot change a string column to long" in text, text

    code, _ = h.run_daemon(s, timeout=180)  # the daemon meets the refused spec first, with nothing to read
    assert code == 0
    more = devservices.make_records(150, start=200)
    devservices.produce_kafka(kafka_broker.bootstrap, name, more)
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    h.assert_exactly_once(h.key_counts(spark, s, "refuse"), h.keys(first + more))
    assert table_types(s, "refuse")["bytes"] == "string"
    rows = rows_by_id(s, "refuse", ["bytes"])
    assert rows["k000300"]["bytes"] == str(json.loads(more[100][1])["bytes"])


def test_the_running_daemon_keeps_its_spec_when_the_table_refuses_a_change(spark, kafka_broker, topic,
                                                                           tmp_path):
    """The same refusal while the daemon runs (a daemon thread): it keeps ingesting by
    the old spec; records produced after the refused change land."""
    name = topic(partitions=1)
    first = devservices.make_records(100)
    devservices.produce_kafka(kafka_broker.bootstrap, name, first)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, typed_spec("live", kafka_broker, name, "json", ["id", "bytes", *VIRTUAL]))
    daemon = Daemon(s)
    thread = threading.Thread(target=lambda: daemon.run(timeout=300), name="daemon", daemon=True)
    thread.start()
    try:
        _wait_for(lambda: sum(h.key_counts(spark, s, "live").values()) == 100, 120)
        h.write_spec(s.specs, typed_spec("live", kafka_broker, name, "json",
                                         ["id", {"name": "bytes", "type": "long"}, *VIRTUAL]))
        time.sleep(3)
        more = devservices.make_records(100, start=100)
        devservices.produce_kafka(kafka_broker.bootstrap, name, more)
        _wait_for(lambda: sum(h.key_counts(spark, s, "live").values()) == 200, 60)
    finally:
        daemon.request_stop()
        thread.join(120)
    assert not thread.is_alive(), "the daemon did not stop"
    h.assert_exactly_once(h.key_counts(spark, s, "live"), h.keys(first + more))
    assert table_types(s, "live")["bytes"] == "string"


def _wait_for(check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # the daemon has not made its database or table yet
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(1)
