"""Issue 42's speed goal, the part a task owns: decoding Avro must cost a task less than
JSON does (the benchmark's Avro job has to beat the JSON job, whose reads and writes it
shares). Measured in one process on the benchmark's records, so a busy machine slows both
sides alike; the best of a few rounds takes out a neighbour's burst."""

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


def _best(data_schema: DataSchema, batches: list[pa.RecordBatch], base_dir: str) -> float:
    best = float("inf")
    for _ in range(4):
        t = Transformer(data_schema, base_dir=base_dir)
        started = time.perf_counter()
        rows = sum(t(b).rows.num_rows for b in batches)
        best = min(best, time.perf_counter() - started)
        assert rows == N
    return best


def test_decoding_avro_costs_a_task_less_than_json(tmp_path):
    (tmp_path / "click.avsc").write_text(json.dumps(SCHEMA))
    records = devservices.make_records(N)
    parsed, buf, bodies = fastavro.parse_schema(SCHEMA), io.BytesIO(), []
    for _, value in records:
        buf.seek(0)
        buf.truncate()
        fastavro.schemaless_writer(buf, parsed, json.loads(value))
        bodies.append(buf.getvalue())
    avro = _best(_data_schema("avro", schemaFile="click.avsc"), _batches(bodies), str(tmp_path))
    text = _best(_data_schema("json"), _batches([v for _, v in records]), str(tmp_path))
    # before the numpy reader: 1.2 x JSON (DuckDB over a container file); after: 0.45 x
    assert avro < 0.8 * text, f"Avro {avro:.3f} s against JSON {text:.3f} s for {N} records"
