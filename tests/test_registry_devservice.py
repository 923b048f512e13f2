"""devservices/registry.py answers what confluent-kafka's registry client asks, as a
Confluent registry would: registration, ids, versions, 404s, Basic auth, going down."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from devservices.registry import Registry

AVSC = json.dumps({"type": "record", "name": "A", "fields": [{"name": "x", "type": "int"}]})
AVSC2 = json.dumps({"type": "record", "name": "A", "fields": [{"name": "x", "type": "long"}]})


def test_the_calls_the_client_makes():
    with Registry() as reg:
        c = SchemaRegistryClient({"url": reg.url})
        sid = c.register_schema("t-value", Schema(AVSC, "AVRO"))
        assert c.register_schema("other-value", Schema(AVSC, "AVRO")) == sid  # same text, same id
        sid2 = c.register_schema("t-value", Schema(AVSC2, "AVRO"))
        assert sid2 != sid
        fresh = SchemaRegistryClient({"url": reg.url})  # no client cache
        assert fresh.get_schema(sid).schema_str == AVSC and fresh.get_schema(sid).schema_type == "AVRO"
        latest = fresh.get_latest_version("t-value")
        assert (latest.schema_id, latest.version) == (sid2, 2)
        assert fresh.get_version("t-value", 1).schema_id == sid
        assert fresh.lookup_schema("t-value", Schema(AVSC2, "AVRO")).version == 2
        assert set(fresh.get_subjects()) == {"t-value", "other-value"}
        with pytest.raises(SchemaRegistryError) as e:
            fresh.get_schema(999)
        assert e.value.http_status_code == 404 and e.value.error_code == 40403
        assert reg.requests[f"GET /schemas/ids/{sid}"] == 1


def test_basic_auth_and_down():
    with Registry(auth=("u", "p")) as reg:
        with pytest.raises(SchemaRegistryError) as e:
            SchemaRegistryClient({"url": reg.url}).get_subjects()
        assert e.value.http_status_code == 401
        ok = SchemaRegistryClient({"url": reg.url, "basic.auth.user.info": "u:p", "max.retries": 0})
        assert ok.get_subjects() == []
        reg.down()
        with pytest.raises(Exception):  # noqa: B017 - httpx's connection error, whatever its class
            ok.get_subjects()
        reg.up()
        assert ok.get_subjects() == []
