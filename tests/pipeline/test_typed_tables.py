"""Typed tables (issue 42) through the task: a schema file resolved against the spec's
directory and sent with the plan, a timestamp of its own type read as that instant, a
registry that is down failing the task (no dead letters), and schema discovery."""

from __future__ import annotations

import io
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler.model import DataSchema, KafkaSource, Metric, PartitionRange, SupervisorSpec
from reconciler.pipeline import batch, tasks
from reconciler.streams.base import record_schema

T0 = 1_700_000_000_000  # ms
SCHEMA = {"type": "record", "name": "O", "fields": [
    {"name": "id", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "country", "type": "string"}]}


def avro_body(schema: dict, rec: dict) -> bytes:
    from fastavro import parse_schema, schemaless_writer

    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(schema), rec)
    return buf.getvalue()


def records(values: list[bytes | None], stream_ms: int = T0) -> pa.RecordBatch:
    n = len(values)
    schema = record_schema("us")
    cols = {"partition": pa.array(["0"] * n), "offset": pa.array(range(n), pa.int64()),
            "key": pa.nulls(n, pa.binary()), "value": pa.array(values, pa.binary()),
            "stream_time": pa.array([stream_ms * 1000] * n, pa.timestamp("us", tz="UTC"))}
    return pa.RecordBatch.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema)


class ValuesReader:
    """A stand-in stream serving the values of ``VALUES`` (one partition, offsets 0..n)."""

    VALUES: list[bytes] = []

    def __init__(self, source: object = None):
        self.source = source

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536):
        yield records(self.VALUES[rng.start:rng.end])




def spec(ds: DataSchema) -> SupervisorSpec:
    return SupervisorSpec("orders", KafkaSource("unused:1", "t"), ds)


def test_the_schema_file_is_read_under_the_spec_dir_and_travels_with_the_plan(tmp_path, monkeypatch):
    """The file is found relative to the spec's directory (not the daemon's cwd) and its
    bytes are in the task plan: the task reads it even where the file is not."""
    specs = tmp_path / "specs"
    (specs / "schemas").mkdir(parents=True)
    (specs / "schemas" / "o.avsc").write_text(json.dumps(SCHEMA))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ds = DataSchema("orders", "ts", format="avro", dimensions=("country",),
                    metrics=(Metric("id", "longSum", "id"),),
                    format_options={"schemaFile": "schemas/o.avsc"})
    ValuesReader.VALUES = [avro_body(SCHEMA, {"id": i, "ts": T0 + i, "country": "DE"}) for i in range(3)]
    ranges = [PartitionRange("0", 0, 3)]
    plan = batch.task_plan(spec(ds), ranges, tmp_path / "d", tmp_path / "dl", spec_dir=str(specs))
    assert plan.format_files == {"schemas/o.avsc": json.dumps(SCHEMA).encode()}
    (specs / "schemas" / "o.avsc").unlink()  # an executor elsewhere has no such file
    plan = tasks.TaskPlan(**{**plan.__dict__, "reader": ValuesReader})
    out = tasks._one(plan, plan.groups[0])
    data = [r for r in out if r["kind"] == tasks.DATA]
    assert sum(r["rows"] for r in data) == 3 and not [r for r in out if r["kind"] == tasks.DEAD]
    table = pq.read_table(f"{plan.data_dir}/{data[0]['path']}")
    assert sorted(table.column("id").to_pylist()) == [0, 1, 2]


def test_a_missing_schema_file_says_where_it_was_looked_for(tmp_path):
    ds = DataSchema("orders", "ts", format="avro", format_options={"schemaFile": "schemas/nope.avsc"})
    with pytest.raises(ValueError, match="avro.schemaFile 'schemas/nope.avsc' cannot be read.*specs"):
        batch.task_plan(spec(ds), [PartitionRange("0", 0, 1)], tmp_path / "d", tmp_path / "dl",
                        spec_dir=str(tmp_path / "specs"))


@pytest.mark.parametrize("ts_format", ["auto", "iso", "seconds", "millis"])
def test_an_avro_timestamp_is_that_instant_whatever_the_format(tmp_path, ts_format):
    from reconciler.pipeline.transform import Transformer

    (tmp_path / "o.avsc").write_text(json.dumps(SCHEMA))
    ds = DataSchema("orders", "ts", timestamp_format=ts_format, format="avro", dimensions=("country",),
                    format_options={"schemaFile": "o.avsc"})
    values = [avro_body(SCHEMA, {"id": 1, "ts": T0 + 5, "country": "DE"})]
    out = Transformer(ds, base_dir=str(tmp_path))(records(values))
    assert out.dead.num_rows == 0
    assert out.rows.column("__time").cast(pa.int64()).to_pylist() == [(T0 + 5) * 1000]


@pytest.mark.parametrize("ts_format", ["iso", "seconds", "millis"])
def test_a_typed_timestamp_dimension_is_read_as_an_instant_whatever_the_format(ts_format):
    """JSON: the timestamp column declared as a ``timestamp`` dimension reads by that type's
    rule (ISO text, or a number of seconds or millis) whatever ``timestamp.format`` says."""
    from reconciler.model import Dimension
    from reconciler.pipeline.transform import Transformer

    ds = DataSchema("orders", "ts", timestamp_format=ts_format, format="json", dimensions=("ts", "country"),
                    typed=(Dimension("ts", "timestamp", ("ts",)), Dimension("country", "string", ("country",))))
    values = [json.dumps({"ts": v, "country": "DE"}).encode()
              for v in ("2023-11-14T22:13:20.005Z", T0 + 5, (T0 + 5) / 1000)]
    out = Transformer(ds)(records(values))
    assert out.dead.num_rows == 0, out.dead.column("reason").to_pylist()
    assert out.rows.column("__time").cast(pa.int64()).to_pylist() == [(T0 + 5) * 1000] * 3
    assert out.rows.column("ts").cast(pa.int64()).to_pylist() == [(T0 + 5) * 1000] * 3
