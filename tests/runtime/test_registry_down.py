"""A schema registry that is down (issue 42): the supervisor's status says so with the
registry's URL (no credentials), whether the task's error comes straight or through a
Spark worker's wrapper; nothing is published; the supervisor runs again once it answers.
The store is a real SQLite database, the registry the minimal one of devservices."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devservices.registry import Registry
from reconciler.control.actual import DetailedState, State
from reconciler.model import DataSchema, SupervisorSpec
from reconciler.pipeline.formats import Field, format_for
from reconciler.pipeline.formats import registry as sources
from reconciler.runtime import supervisor as sup
from reconciler.runtime.supervisor import RuntimeContext, StepOutcome, SupervisorRuntime
from reconciler.store.store import Store

SCHEMA = {"type": "record", "name": "O", "fields": [{"name": "id", "type": "long"}]}


@pytest.fixture
def registry():
    sources._FETCHED.clear()
    with Registry() as reg:
        yield reg


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    s.create_supervisor(SupervisorSpec.from_document({
        "id": "orders", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "o"},
        "dataSchema": {"datasource": "orders", "timestamp": {"column": "ts"}}}), None, actor="test")
    yield s
    s.close()


def _decode_through(registry: Registry, url: str):
    """A batch's decode against the registry (``url``: how the spec names it)."""
    value = AvroSerializer(SchemaRegistryClient({"url": registry.url}), json.dumps(SCHEMA))(
        {"id": 1}, SerializationContext("o", MessageField.VALUE))
    fmt = format_for(DataSchema("orders", "ts", format="avro", format_options={"schemaRegistry": {"url": url}}))
    return lambda: fmt.decode(pa.array([value], pa.binary()), [Field("id", ("id",), "long")])


def _wrapped(call):
    """The task's error as the driver receives it from a Spark Python worker (PythonException)."""
    def run():
        try:
            call()
        except Exception as e:
            raise RuntimeError(
                "An exception was thrown from the Python worker. Please see the stack trace below.\n"
                "Traceback (most recent call last):\n  File \"tasks.py\", line 1, in _one\n"
                f"{type(e).__module__}.{type(e).__qualname__}: {e}\n") from None
    return run


@pytest.mark.parametrize("through_spark", [False, True])
def test_registry_down_is_unhealthy_with_its_url_and_recovers(registry, store, tmp_path, monkeypatch,
                                                              through_spark):
    url = registry.url.replace("http://", "http://reader:s3cret@")
    decode = _decode_through(registry, url)
    registry.down()
    batch = _wrapped(decode) if through_spark else decode
    published = []

    def ingest(self, rec, spec):
        batch()
        published.append(rec.id)
        self._report(rec, State.RUNNING, DetailedState.RUNNING, None)
        return StepOutcome(1.0)

    monkeypatch.setattr(SupervisorRuntime, "_ingest", ingest)
    rt = SupervisorRuntime("orders", RuntimeContext(store, tmp_path, spark=lambda: None))
    for _ in range(sup.UNHEALTHY_AFTER):
        rt.step()
    rec = store.get("orders")
    assert rec.state == State.UNHEALTHY_SUPERVISOR and rec.detailed_state == DetailedState.UNHEALTHY_SUPERVISOR
    host = registry.url.removeprefix("http://")
    assert rec.last_error.startswith(f"schema registry http://reader:***@{host} is unreachable"), rec.last_error
    assert "s3cret" not in rec.last_error and "Traceback" not in rec.last_error
    assert published == []
    registry.up()
    rt.step()
    assert published == ["orders"] and store.get("orders").state == State.RUNNING
