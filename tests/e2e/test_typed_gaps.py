"""Issue 42's last gaps end to end (real Tansu, real Spark, the daemon in this process).

* A new discovered JSON column met with different kinds by the tasks of its first batch:
  never a failed (forever retried) batch; its type is the join of the batch's values,
  whatever the cut into tasks; a value that does not fit is a dead letter naming the field.
* Dead letters of a typed spec with a format's schema file, replayed after the spec is
  fixed: decoded with the same format and file, written in the table's types, once.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import devservices
from tests.e2e import helpers as h
from tests.e2e.test_typed_formats import (  # noqa: F401 (registry: a fixture)
    V1,
    VIRTUAL,
    avro_records,
    order,
    registry,
    rows_by_id,
    status,
    table_types,
    typed_spec,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

T0 = devservices.DEFAULT_TS_START_MS


def _mixed(i: int) -> tuple[str, bytes, int]:
    """Partition 0: q and w integers; partition 1: q fractions, w text."""
    p = i % 2
    v = {"id": f"k{i:06d}", "ts": T0 + i * 1000, "q": i / 4 + 0.125 if p else i, "w": f"w{i}" if p else i}
    return v["id"], json.dumps(v).encode(), p


def test_tasks_typing_a_new_json_column_differently_never_fail_the_batch(spark, kafka_broker, topic, tmp_path):
    name = topic(partitions=2)
    records = [_mixed(i) for i in range(200)]
    lossy = ("lossy", json.dumps({"id": "lossy", "ts": T0, "q": 2**53 + 1, "w": 1}).encode(), 0)
    devservices.produce_kafka(kafka_broker.bootstrap, name, [(k, v) for k, v, _ in [*records, lossy]],
                              partition_of=lambda key, _v: 0 if key == b"lossy" else [p for k, _, p in records
                                                                                      if k.encode() == key][0])
    s = h.make_settings(tmp_path)
    for sid, tasks in (("two", 2), ("one", 1)):  # the same records, cut into two tasks and into one
        doc = typed_spec(sid, kafka_broker, name, "json", ["id", *VIRTUAL], schemaDiscovery=True)
        doc["taskCount"] = tasks
        h.write_spec(s.specs, doc)
    code, _ = h.run_daemon(s, timeout=240)
    assert code == 0  # it failed the batch on every retry: "field q is int64 in one task ... double in another"

    for sid in ("two", "one"):
        h.assert_exactly_once(h.key_counts(spark, s, sid), [k for k, _, _ in records])
        types = table_types(s, sid)
        assert (types["q"], types["w"]) == ("double", "string"), types
        rows = rows_by_id(s, sid, ["q", "w"])
        assert (rows["k000004"]["q"], rows["k000004"]["w"]) == (4.0, "4")
        assert (rows["k000005"]["q"], rows["k000005"]["w"]) == (1.375, "w5")
        [(_, _, reason)] = h.deadletters(spark, s, sid)
        assert reason == f"field q: {2**53 + 1} would lose precision as double", reason
        assert status(s, sid)["unparseable"] == 1


def test_replay_of_a_typed_avro_schema_file_spec_decodes_and_types_as_a_batch(spark, kafka_broker, topic,
                                                                              tmp_path):
    """avro: {schemaFile} (relative to the spec's directory), a typed long, a nested path,
    schemaDiscovery: half the records carry ts in millis, which format: seconds reads as a
    year beyond 9999 (dead letters) and the spec's fix (format: auto) reads right. Replay decoded with no schema file
    (looked for it in the working directory) and typed discovered columns afresh."""
    import fastavro

    name = topic(partitions=2)
    s = h.make_settings(tmp_path)
    (Path(s.specs) / "schemas").mkdir(parents=True)
    (Path(s.specs) / "schemas" / "orders.avsc").write_text(json.dumps(V1))
    parsed = fastavro.parse_schema(V1)
    records = []
    for i in range(300):
        o = order(i)
        if i % 2:
            o["ts"] = o["ts"] // 1000  # seconds: the others, millis, are dead letters under format: seconds
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, o)
        records.append((o["id"], buf.getvalue()))
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    dims = ["id", {"name": "qty", "type": "long"}, {"name": "city", "path": "geo.city"}, *VIRTUAL]

    def spec(ts_format: str) -> dict:
        doc = typed_spec("rep", kafka_broker, name, "avro", dims, {"schemaFile": "schemas/orders.avsc"},
                         schemaDiscovery=True)
        doc["dataSchema"]["timestamp"] = {"column": "ts", "format": ts_format}
        return doc

    h.write_spec(s.specs, spec("seconds"))
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    types = table_types(s, "rep")
    assert (types["qty"], types["city"], types["price"], types["country"]) == ("long", "string", "double", "string")
    assert status(s, "rep")["unparseable"] == 150
    h.assert_exactly_once(h.key_counts(spark, s, "rep"), [k for k, _ in records if int(k[1:]) % 2])
    assert len(h.deadletters(spark, s, "rep")) == 150

    h.write_spec(s.specs, spec("auto"))
    assert h.run_cli(s, "apply")[0] == 0
    code, out = h.run_cli(s, "deadletter", "replay", "rep", "-o", "json")
    result = json.loads(out)
    assert code == 0 and result["replayed"] == 150 and result["committed"], out
    code, out = h.run_cli(s, "deadletter", "replay", "rep", "-o", "json")  # a second one finds nothing
    assert json.loads(out).get("replayed", 0) == 0 and "no dead letters" in out, out

    h.assert_exactly_once(h.key_counts(spark, s, "rep"), h.keys(records))
    assert h.deadletters(spark, s, "rep") == []
    assert table_types(s, "rep") == types
    rows = rows_by_id(s, "rep", ["qty", "city", "price", "country", "geo"])
    assert rows["k000007"] == {"id": "k000007", "qty": 7, "city": "c2", "price": 1.75, "country": "DE",
                               "geo": {"city": "c2"}}


GEO2 = {"type": "record", "name": "Geo", "fields": [{"name": "city", "type": "string"},
                                                     {"name": "zip", "type": ["null", "string"], "default": None}]}
V1_ZIP = {**V1, "fields": [f if f["name"] != "geo" else {"name": "geo", "type": GEO2} for f in V1["fields"]]}


def test_a_nested_field_a_later_writer_adds_is_added_to_the_record_column(spark, kafka_broker, topic, tmp_path,
                                                                          registry):  # noqa: F811
    """geo {city} then geo {city, zip}: zip was cast away without a word (the table's
    struct decided); now the column gains geo.zip, null in the old rows."""
    name = topic(partitions=1)
    v1 = avro_records(registry, name, V1, [order(i) for i in range(50)])
    devservices.produce_kafka(kafka_broker.bootstrap, name, v1)
    s = h.make_settings(tmp_path)
    doc = typed_spec("nest", kafka_broker, name, "avro", VIRTUAL, {"schemaRegistry": {"url": registry.url}},
                     schemaDiscovery=True)
    h.write_spec(s.specs, doc)
    assert h.run_daemon(s, timeout=180)[0] == 0
    assert table_types(s, "nest")["geo"].startswith("struct<") and "zip" not in table_types(s, "nest")["geo"]

    v2 = avro_records(registry, name, V1_ZIP, [{**order(i), "geo": {"city": "c", "zip": f"z{i}"}}
                                               for i in range(50, 80)])
    devservices.produce_kafka(kafka_broker.bootstrap, name, v2)
    assert h.run_daemon(s, timeout=180)[0] == 0
    h.assert_exactly_once(h.key_counts(spark, s, "nest"), h.keys(v1 + v2))
    assert "zip" in table_types(s, "nest")["geo"], table_types(s, "nest")
    rows = rows_by_id(s, "nest", ["geo"])
    assert rows["k000060"]["geo"] == {"city": "c", "zip": "z60"}
    assert rows["k000007"]["geo"] == {"city": "c2", "zip": None}
    assert status(s, "nest")["unparseable"] == 0
