"""Product bugs found by the typed-tables end-to-end tests (issue 42), each a failing test.

Not committed: they fail on the current code, and are reported to the engineer finishing
the product side.
"""

from __future__ import annotations

import json

import pytest

import devservices
from tests.e2e import helpers as h
from tests.e2e.test_typed_formats import VIRTUAL, optional, rows_by_id, table_types, typed_spec

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def test_a_dimension_added_to_a_json_spec_adds_an_optional_column(spark, kafka_broker, topic, tmp_path):
    """The spec gains {name: coupon, type: long} while records wait (the daemon is down):
    plan previews the column, yet the daemon's first batch after its start is written by
    the previously applied spec (rec.spec: no coupon column, in the files and the table),
    although `plan` then says the database matches the directory. Records the changed spec
    should have typed lose the new field. Applied first with nothing to read, the same
    change works (tests/e2e/test_typed_formats.py::test_avro_schema_evolution)."""
    name = topic(partitions=1)
    first = devservices.make_records(100)
    devservices.produce_kafka(kafka_broker.bootstrap, name, first)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, typed_spec("grow", kafka_broker, name, "json", ["id", "user", *VIRTUAL]))
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0 and "coupon" not in table_types(s, "grow")

    more = [(k, json.dumps({**json.loads(v), "coupon": int(k[1:])}).encode())
            for k, v in devservices.make_records(100, start=100)]
    devservices.produce_kafka(kafka_broker.bootstrap, name, more)
    h.write_spec(s.specs, typed_spec("grow", kafka_broker, name, "json",
                                     ["id", "user", {"name": "coupon", "type": "long"}, *VIRTUAL]))
    code, text = h.run_cli(s, "plan")
    assert code == 2 and "grow: + column coupon long (optional)" in text, text
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "grow"), h.keys(first + more))
    assert table_types(s, "grow").get("coupon") == "long" and optional(s, "grow", "coupon")
    rows = rows_by_id(s, "grow", ["coupon"])
    assert rows["k000007"]["coupon"] is None and rows["k000150"]["coupon"] == 150


def test_the_iceberg_type_of_a_nested_column():
    """schemaDiscovery of an Avro record field (test_typed_discovery.py): every publish
    fails in table/types.iceberg_types, whose name mapping names only the top-level fields
    ("Could not find field with name: geo.city"), and the supervisor retries for ever."""
    import pyarrow as pa

    from reconciler.table.types import iceberg_types

    schema = pa.schema([pa.field("id", pa.string()),
                        pa.field("geo", pa.struct([pa.field("city", pa.string())])),
                        pa.field("tags", pa.list_(pa.string()))])
    found = {name: str(kind) for name, kind in iceberg_types(schema).items()}
    assert found["id"] == "string" and found["geo"].startswith("struct<") and found["tags"].startswith("list<")
