"""Documentation is tested: every example spec and marker in examples/ loads and validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.model import KafkaSource, RabbitSource
from reconciler.spec.loader import classify, load_marker_file, load_spec_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPEC_FILES = sorted(p for p in EXAMPLES.iterdir() if p.is_file() and classify(p) == "spec")
MARKER_DIR = EXAMPLES / "markers"
MARKER_FILES = sorted(MARKER_DIR.rglob("*.reset.y*ml"))


def test_the_documented_examples_exist():
    names = {p.name for p in SPEC_FILES}
    assert {"clicks.yaml", "orders.yaml", "clicks-rollup.yaml"} <= names


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in SPEC_FILES])
def test_example_spec_is_valid(path):
    spec = load_spec_file(path)
    assert spec.document["id"] == spec.id


def test_example_ids_and_datasources_are_unique():
    specs = [load_spec_file(p) for p in SPEC_FILES]
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids))
    datasources = [s.data_schema.datasource for s in specs]
    assert len(datasources) == len(set(datasources))


def test_kafka_clicks_matches_the_design():
    spec = load_spec_file(EXAMPLES / "clicks.yaml")
    assert spec.id == "clicks"
    assert isinstance(spec.source, KafkaSource)
    assert (spec.source.bootstrap_servers, spec.source.topic) == ("127.0.0.1:9092", "clicks")
    assert spec.data_schema.datasource == "clicks"
    assert spec.task_duration == 5.0


def test_rabbitmq_orders_matches_the_design():
    spec = load_spec_file(EXAMPLES / "orders.yaml")
    assert isinstance(spec.source, RabbitSource)
    assert spec.source.streams == ("orders-0", "orders-1")
    assert "${env:RMQ_PASSWORD}" in spec.source.uri  # kept verbatim, resolved only in the client
    assert spec.data_schema.datasource == "orders"


def test_kafka_clicks_rollup_matches_the_design():
    spec = load_spec_file(EXAMPLES / "clicks-rollup.yaml")
    assert spec.id == "clicks-rollup"
    assert spec.data_schema.datasource == "clicks_rollup"
    assert spec.data_schema.rollup is True
    assert spec.data_schema.query_granularity == "minute"
    assert [(m.name, m.type, m.field) for m in spec.data_schema.metrics] == [
        ("count", "count", None),
        ("bytes", "longSum", "bytes"),
    ]


def test_a_marker_example_exists_for_every_position_type():
    kinds = {load_marker_file(p).reset_to.kind for p in MARKER_FILES}
    assert kinds == {"latest", "earliest", "timestamp", "offsets", "shiftBy"}


def test_marker_examples_name_example_supervisors():
    ids = {load_spec_file(p).id for p in SPEC_FILES}
    assert {load_marker_file(p).supervisor_id for p in MARKER_FILES} <= ids


@pytest.mark.parametrize("path", [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in MARKER_FILES])
def test_example_marker_is_valid(path):
    marker = load_marker_file(path, known_ids=None)
    assert classify(path) == "marker"
    assert marker.supervisor_id == path.name.split(".reset.")[0]


def test_the_lag_policy_example():
    spec = load_spec_file(EXAMPLES / "lag-policy" / "clicks.yaml")
    p = spec.lag_policy
    assert (p.max_records, p.max_lag, p.for_seconds, p.action, p.cooldown, p.backfill_task_count) == \
        (5_000_000, 3600.0, 120.0, "resetToLatestAndBackfill", 3600.0, 4)
    assert spec.id == "clicks" and spec.source == load_spec_file(EXAMPLES / "clicks.yaml").source
