"""Column names: ``validate`` refuses what the pipeline refuses (issue 29), with file:line."""

from __future__ import annotations

import random

import pytest

from reconciler.model import SupervisorSpec
from reconciler.spec import columns
from reconciler.spec.validate import validate_document
from reconciler.spec.yamlsafe import parse_yaml


def spec_yaml(dimensions: list[str], metrics: list[str] = (), rollup: bool = False) -> str:
    metric_lines = "".join(f"    - {m}\n" for m in metrics)
    return (f"id: a\nsource: {{type: kafka, bootstrapServers: 'h:9092', topic: t}}\ndataSchema:\n"
            f"  datasource: a\n  timestamp: {{column: ts}}\n  dimensions: [{', '.join(dimensions)}]\n"
            + (f"  metrics:\n{metric_lines}" if metrics else "")
            + f"  granularity: {{rollup: {str(rollup).lower()}}}\n")


@pytest.mark.parametrize("dims, metrics, rollup, expected", [
    (["user", "USER"], [], False,
     "specs/a.yaml:6:22: dataSchema.dimensions[1]: 'USER' is 'user' in another case, already a column at "
     "dataSchema.dimensions[0]: column names must be unique, whatever their case"),
    (["user", "__TIME"], [], False,
     "specs/a.yaml:6:22: dataSchema.dimensions[1]: '__TIME' is a column the output writes itself (reserved: "
     "__time, time_chunk, in any case); use another name"),
    (["Time_Chunk"], [], False,
     "specs/a.yaml:6:16: dataSchema.dimensions[0]: 'Time_Chunk' is a column the output writes itself (reserved: "
     "__time, time_chunk, in any case); use another name"),
    (["__KEY"], [], False,
     "specs/a.yaml:6:16: dataSchema.dimensions[0]: '__KEY' is the virtual column '__key' in another case: write "
     "'__key' for the virtual column, or choose another name"),
    (["count"], ["{name: count, type: count}"], True,
     "specs/a.yaml:8:14: dataSchema.metrics[0].name: 'count' is the same name, already a column at "
     "dataSchema.dimensions[0]: column names must be unique, whatever their case"),
    (["user"], ["{name: n, type: longSum, field: User}"], False,
     "specs/a.yaml:8:39: dataSchema.metrics[0].field: 'User' is 'user' in another case, already a column at "
     "dataSchema.dimensions[0]: column names must be unique, whatever their case"),
])
def test_column_names_the_pipeline_refuses_are_invalid_with_file_and_line(dims, metrics, rollup, expected):
    parsed = parse_yaml(spec_yaml(dims, metrics, rollup), "specs/a.yaml")
    assert [str(p) for p in validate_document(parsed)] == [expected]


def test_fine_names_pass():
    parsed = parse_yaml(spec_yaml(["user", "__key", "__offset", "count_"], ["{name: count, type: count}"],
                                  rollup=True), "specs/a.yaml")
    assert validate_document(parsed) == []


_NAMES = ["user", "User", "USER", "page", "count", "Count", "bytes", "__time", "__TIME", "time_chunk",
          "TIME_CHUNK", "__key", "__Key", "__offset", "__stream_time", "n"]
_TYPES = ["count", "longSum", "doubleSum", "longMax", "doubleMin"]


def _random_data_schema(rng: random.Random) -> dict:
    dims = rng.sample(_NAMES, rng.randint(0, 4))
    metrics = []
    for _ in range(rng.randint(0, 3)):
        kind = rng.choice(_TYPES)
        name = rng.choice(["n", "m", "count", "Count", "bytes", "user", "__time", "time_chunk", "x"])
        metric = {"name": name, "type": kind}
        if kind != "count":
            metric["field"] = rng.choice(_NAMES + ["bytes", "v"])
        metrics.append(metric)
    return {"datasource": "d", "timestamp": {"column": "ts"}, "dimensions": dims, "metrics": metrics,
            "granularity": {"rollup": rng.random() < 0.5}}


def test_the_rules_agree_with_the_pipeline_on_generated_data_schemas():
    """Whatever the pipeline refuses, validation refuses; validation refuses nothing else but
    names that are a virtual column's in another case (which read a JSON field that looks virtual)."""
    from reconciler.pipeline.transform import output_columns

    rng = random.Random(29)
    refused = accepted = 0
    for _ in range(3000):
        ds = _random_data_schema(rng)
        doc = {"id": "a", "source": {"type": "kafka", "bootstrapServers": "h:9092", "topic": "t"}, "dataSchema": ds}
        found = columns.problems(parse_yaml_data(doc))
        try:
            output_columns(SupervisorSpec.from_document(doc).data_schema)
            pipeline_ok = True
        except ValueError:
            pipeline_ok = False
        if not pipeline_ok:
            assert found, ds
            refused += 1
        else:
            assert all("is the virtual column" in p.message for p in found), (ds, found)
            accepted += 1
    assert refused > 300 and accepted > 300  # both sides were exercised


def parse_yaml_data(doc: dict):
    from reconciler.spec.yamlsafe import ParsedYaml

    return ParsedYaml(path="a.yaml", data=doc)


@pytest.mark.parametrize("rollup", [False, True])
def test_the_types_are_the_ones_the_pipeline_writes(rollup):
    """``crossfile`` compares these types between supervisors of one datasource: they must be
    the table's."""
    from reconciler.pipeline.transform import output_schemas

    ds = {"datasource": "d", "timestamp": {"column": "ts"},
          "dimensions": ["user", "__key", "__partition", "__offset", "__stream_time"],
          "metrics": [{"name": "count", "type": "count"}, {"name": "b", "type": "longSum", "field": "bytes"},
                      {"name": "v", "type": "doubleMax", "field": "value"},
                      {"name": "w", "type": "longMin", "field": "value"}],
          "granularity": {"rollup": rollup}}
    doc = {"id": "a", "source": {"type": "kafka", "bootstrapServers": "h:9092", "topic": "t"}, "dataSchema": ds}
    schema, _ = output_schemas(SupervisorSpec.from_document(doc).data_schema)
    arrow = {"string": "string", "int64": "long", "double": "double"}
    written = {f.name: ("timestamp" if str(f.type).startswith("timestamp") else arrow[str(f.type)])
               for f in schema}
    assert written == {c.name: c.type for c in columns.output_columns(ds)}
