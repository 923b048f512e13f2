"""Issue 42's speed goal, the part a task owns: decoding Avro must cost a task less than
JSON does (the benchmark's Avro job has to beat the JSON job, whose reads and writes it
shares). Measured in one process on the benchmark's records, so a busy machine slows both
sides alike; the best of a few alternating rounds takes out a neighbour's burst."""

from __future__ import annotations

import io
import json
import time

import fastavro
import pyarrow as pa

import devservices
from reconciler.model import DataSchema, Dimension, Metric
from reconciler.pipeline.transform import Transformer

SCHEMA = {"type": "record", "name": "Click", "namespace": "bench", "fields": [
    {"name": "id", "type": "string"}, {"name": "ts", "type": "long"}, {"name": "user", "type": "string"},
    {"name": "page", "type": "string"}, {"name": "bytes", "type": "long"}]}
N = 196_608  # three of the reader's batches of 65,536


def _batches(values: list[bytes]) -> list[pa.RecordBatch]:
    out = []
    for s in range(0, len(values), 65_536):
        v = values[s:s + 65_536]
        out.append(pa.RecordBatch.from_pydict({
            "partition": pa.array(["0"] * len(v)), "offset": pa.array(range(s, s + len(v)), pa.int64()),
            "key": pa.nulls(len(v), pa.binary()), "value": pa.array(v, pa.binary()),
            "stream_time": pa.array([0] * len(v), pa.timestamp("ms", tz="UTC"))}))
    return out


def _data_schema(fmt: str, **options) -> DataSchema:
    dims = ("id", "user", "page", "__partition", "__offset")
    return DataSchema("clicks", "ts", "millis", fmt, dims, (Metric("bytes", "longSum", "bytes"),),
                      typed=tuple(Dimension(d, "string", (d,)) for d in dims), format_options=options)


def _once(data_schema: DataSchema, batches: list[pa.RecordBatch], base_dir: str) -> float:
    t = Transformer(data_schema, base_dir=base_dir)
    started = time.perf_counter()
    rows = sum(t(b).rows.num_rows for b in batches)
    assert rows == N
    return time.perf_counter() - started


def test_decoding_avro_costs_a_task_less_than_json(tmp_path):
    (tmp_path / "click.avsc").write_text(json.dumps(SCHEMA))
    records = devservices.make_records(N)
    parsed, buf, bodies = fastavro.parse_schema(SCHEMA), io.BytesIO(), []
    for _, value in records:
        buf.seek(0)
        buf.truncate()
        fastavro.schemaless_writer(buf, parsed, json.loads(value))
        bodies.append(buf.getvalue())
    avro_batches, json_batches = _batches(bodies), _batches([v for _, v in records])
    avro, text = float("inf"), float("inf")
    for _ in range(5):  # alternating, so a neighbour's burst slows one round of each, not one side
        avro = min(avro, _once(_data_schema("avro", schemaFile="click.avsc"), avro_batches, str(tmp_path)))
        text = min(text, _once(_data_schema("json"), json_batches, str(tmp_path)))
    # DuckDB over a container file (before): 1.4-1.8 x JSON; the numpy reader: 0.4-0.65 x
    assert avro < text, f"Avro {avro:.3f} s against JSON {text:.3f} s for {N} records"
