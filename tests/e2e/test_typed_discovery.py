"""schemaDiscovery end to end (issue 42): Avro produced by confluent-kafka's AvroSerializer
against devservices/registry.py, real Tansu, real Spark, the daemon in this process.

Every top-level field of the writer schema becomes a column of its own Iceberg type; a
field added by a later writer schema adds an optional column (old rows null) and an
int widened to long widens the column; every key lands exactly once.
"""

from __future__ import annotations

import pytest

import devservices
from tests.e2e import helpers as h
from tests.e2e.test_typed_formats import (  # noqa: F401 (registry: a fixture)
    COUNT,
    NO_ROLLUP,
    V1,
    V2,
    V3,
    VIRTUAL,
    avro_records,
    optional,
    order,
    registry,
    rows_by_id,
    table_types,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def discovery_spec(kafka_broker, topic: str, url: str) -> dict:
    doc = h.spec_doc("disc", h.kafka_source(kafka_broker.bootstrap, topic), dimensions=VIRTUAL,
                     metrics=COUNT, granularity=NO_ROLLUP)
    doc["dataSchema"].update(format="avro", avro={"schemaRegistry": {"url": url}}, schemaDiscovery=True)
    return doc


def test_avro_discovery_makes_every_top_level_field_a_column(spark, kafka_broker, topic, tmp_path, registry):  # noqa: F811
    name = topic(partitions=2)
    v1 = avro_records(registry, name, V1, [order(i) for i in range(200)])
    devservices.produce_kafka(kafka_broker.bootstrap, name, v1)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, discovery_spec(kafka_broker, name, registry.url))
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "disc"), h.keys(v1))
    types = table_types(s, "disc")
    assert {c: types.get(c) for c in ("id", "qty", "price", "country")} == {
        "id": "string", "qty": "int", "price": "double", "country": "string"}, types
    assert "geo" in types, types
    r = rows_by_id(s, "disc", ["qty", "price", "country"])["k000007"]
    assert (r["qty"], r["price"], r["country"]) == (7, 1.75, "DE")

    # v2 adds channel (an optional column, old rows null); v3 widens qty int -> long
    v2 = avro_records(registry, name, V2, [order(i, V2) for i in range(200, 300)])
    v3 = avro_records(registry, name, V3, [order(i, V3, qty=2**31 + i) for i in range(300, 400)])
    devservices.produce_kafka(kafka_broker.bootstrap, name, v2 + v3)
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "disc"), h.keys(v1 + v2 + v3))
    types = table_types(s, "disc")
    assert (types["channel"], types["qty"]) == ("string", "long"), types
    assert optional(s, "disc", "channel")
    rows = rows_by_id(s, "disc", ["qty", "channel"])
    assert all(rows[k]["channel"] is None for k in h.keys(v1))
    assert rows["k000201"]["channel"] == "app" and rows["k000301"]["qty"] == 2**31 + 301
