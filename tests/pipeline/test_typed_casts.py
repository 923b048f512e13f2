"""Issue 42's casts under a table's type, value by value: a value a promotion would round
(a long beyond 2^53 as a double, an int beyond 2^24 as a float) is a dead letter naming the
field, never a failed batch; and a record of no fields is no column."""

from __future__ import annotations

import json
import struct

import pyarrow as pa
import pytest

from reconciler.model import DataSchema, Dimension
from reconciler.pipeline.casts import cast_exact
from reconciler.pipeline.formats import registry
from reconciler.pipeline.transform import Transformer
from tests.pipeline.test_typed_tables import T0, avro_body, records

URL = "http://registry.invalid:8081"  # never asked: its two schemas are in the process's cache
_TS = {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}
V1 = {"type": "record", "name": "O", "fields": [{"name": "id", "type": "long"}, _TS, {"name": "n", "type": "long"}]}
V2 = {"type": "record", "name": "O", "fields": [{"name": "id", "type": "long"}, _TS, {"name": "n", "type": "double"}]}


@pytest.fixture
def two_writers(monkeypatch):
    """Writer schemas 1 (n long) and 2 (n double) as the registry would serve them."""
    monkeypatch.setitem(registry._FETCHED, (URL, 1), registry.WriterSchema(1, "AVRO", json.dumps(V1)))
    monkeypatch.setitem(registry._FETCHED, (URL, 2), registry.WriterSchema(2, "AVRO", json.dumps(V2)))


def _wire(schema_id: int, schema: dict, rec: dict) -> bytes:
    return b"\0" + struct.pack(">I", schema_id) + avro_body(schema, rec)


def _ds(**kw) -> DataSchema:
    return DataSchema("orders", "ts", format="avro", format_options={"schemaRegistry": {"url": URL}}, **kw)


BATCH = [(1, V1, {"id": 1, "ts": T0, "n": 5}), (1, V1, {"id": 2, "ts": T0, "n": 2**53 + 1}),
         (2, V2, {"id": 3, "ts": T0, "n": 0.5})]


def test_two_writers_of_one_batch_a_long_beyond_2_53_under_their_double_is_a_dead_letter(two_writers):
    # One record batch of both writers: the field's common type is double, and the long
    # 2^53 + 1 does not read back as itself (Arrow's safe cast raised: the task failed).
    out = Transformer(_ds(schema_discovery=True))(records([_wire(*b) for b in BATCH]))
    assert out.rows.column("n").to_pylist() == [5.0, 0.5]
    assert out.dead.column("reason").to_pylist() == ["field n: 9007199254740993 would lose precision as double"]


def test_a_declared_double_dimension_takes_the_long_it_can_and_dead_letters_the_other(two_writers):
    ds = _ds(dimensions=("n",), typed=(Dimension("n", "double", ("n",)),))
    out = Transformer(ds)(records([_wire(*b) for b in BATCH]))
    assert out.rows.column("n").to_pylist() == [5.0, 0.5]
    [reason] = out.dead.column("reason").to_pylist()
    assert "n" in reason and "9007199254740993" in reason


def test_an_avro_int_under_a_float_column_beyond_2_24_is_a_dead_letter_naming_the_field(tmp_path):
    schema = {"type": "record", "name": "O", "fields": [{"name": "id", "type": "long"}, _TS,
                                                        {"name": "m", "type": "int"}]}
    (tmp_path / "v.avsc").write_text(json.dumps(schema))
    ds = DataSchema("orders", "ts", format="avro", schema_discovery=True, format_options={"schemaFile": "v.avsc"})
    t = Transformer(ds, base_dir=str(tmp_path), table_types={"m": pa.float32()})
    out = t(records([avro_body(schema, {"id": 1, "ts": T0, "m": 2**24 + 1}),
                     avro_body(schema, {"id": 2, "ts": T0, "m": 3})]))
    assert out.rows.column("m").to_pylist() == [3.0]
    assert out.dead.column("reason").to_pylist() == ["field m: 16777217 would lose precision as float"]


@pytest.mark.parametrize(("values", "target", "lost"), [
    (pa.array([1, None, 2**53, 2**53 + 1, -(2**63)], pa.int64()), pa.float64(), [False, False, False, True, False]),
    (pa.array([2**24, 2**24 + 1, None], pa.int32()), pa.float32(), [False, True, False]),
    (pa.array([float("nan"), 1.5, None], pa.float32()), pa.float64(), None),
    (pa.array([{"a": 2**53 + 1}, {"a": 1}], pa.struct([("a", pa.int64())])), pa.struct([("a", pa.float64())]),
     [True, False]),
])
def test_cast_exact_nulls_what_would_not_read_back_and_says_which(values, target, lost):
    out, lossy = cast_exact(values, target)
    assert out.type == target
    assert (None if lossy is None else lossy.to_pylist()) == lost
    for i, v in enumerate(values.to_pylist()):
        if lost and lost[i]:
            assert out[i].as_py() is None
        elif v is not None and v == v and not isinstance(v, dict):
            assert out[i].as_py() == v


def test_a_record_of_no_fields_inside_a_record_is_left_out_of_its_column(tmp_path):
    schema = {"type": "record", "name": "O", "fields": [{"name": "id", "type": "long"}, _TS, {
        "name": "geo", "type": {"type": "record", "name": "G", "fields": [
            {"name": "city", "type": "string"},
            {"name": "meta", "type": {"type": "record", "name": "M", "fields": []}}]}}]}
    (tmp_path / "e.avsc").write_text(json.dumps(schema))
    ds = DataSchema("orders", "ts", format="avro", schema_discovery=True, format_options={"schemaFile": "e.avsc"})
    out = Transformer(ds, base_dir=str(tmp_path))(records([avro_body(schema, {"id": 1, "ts": T0,
                                                                               "geo": {"city": "c", "meta": {}}})]))
    assert [(f.name, f.type) for f in out.rows.schema.field("geo").type] == [("city", pa.string())]
    assert out.rows.column("geo").to_pylist() == [{"city": "c"}] and out.dead.num_rows == 0


EMPTY_PROTO = """syntax = "proto3";
package acme;
import "google/protobuf/empty.proto";
import "google/protobuf/timestamp.proto";

message Ping { int64 id = 1; google.protobuf.Timestamp ts = 2; google.protobuf.Empty meta = 3; }
"""


def test_a_protobuf_empty_field_is_no_column_and_the_task_writes_its_records(tmp_path):
    # google.protobuf.Empty is a struct<> column to Arrow, which Parquet cannot write: every
    # retry of the task failed.
    import importlib
    import sys

    import grpc_tools
    from grpc_tools import protoc

    from reconciler.model import PartitionRange
    from reconciler.pipeline import batch, tasks
    from tests.pipeline.test_typed_tables import ValuesReader, spec

    include = f"{grpc_tools.__path__[0]}/_proto"
    (tmp_path / "rc_ping.proto").write_text(EMPTY_PROTO)
    assert protoc.main(["protoc", f"-I{tmp_path}", f"-I{include}", f"--python_out={tmp_path}",
                        f"--descriptor_set_out={tmp_path / 'ping.desc'}", "--include_imports",
                        str(tmp_path / "rc_ping.proto")]) == 0
    sys.path.insert(0, str(tmp_path))
    try:
        pb = importlib.import_module("rc_ping_pb2")
    finally:
        sys.path.remove(str(tmp_path))
    bodies = []
    for i in range(3):
        msg = pb.Ping(id=i)
        msg.ts.FromMilliseconds(T0)
        msg.meta.SetInParent()
        bodies.append(msg.SerializeToString())
    ds = DataSchema("orders", "ts", format="protobuf", schema_discovery=True,
                    format_options={"descriptorFile": "ping.desc", "message": "acme.Ping"})
    ValuesReader.VALUES = bodies
    plan = batch.task_plan(spec(ds), [PartitionRange("0", 0, 3)], tmp_path / "d", tmp_path / "dl",
                           spec_dir=str(tmp_path))
    plan = tasks.TaskPlan(**{**plan.__dict__, "reader": ValuesReader})
    out = tasks.one_task(plan, plan.groups[0])
    assert sum(r["rows"] for r in out if r["kind"] == tasks.DATA) == 3
    [found] = [r["path"] for r in out if r["kind"] == tasks.SCHEMA]
    assert "meta" not in tasks._schema_of(found).names
