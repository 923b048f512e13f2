"""``ingest.py --format avro``: Avro in the Confluent wire format through the product, against
a naive Avro script and against the product's own JSON path, on the same broker in one run.

* The data is ``devservices.make_records`` (``id``, ``ts`` millis, ``user``, ``page``,
  ``bytes``), N records over 4 partitions, twice: as JSON (topic ``json``) and as Avro
  (topic ``avro``): schema ``Click`` registered in devservices/registry.py (no
  Confluent-compatible registry is installable here) by confluent-kafka's own
  ``AvroSerializer``, which serializes the first record; the rest are the same 5-byte
  header (magic 0, the schema id) and a body from fastavro's ``schemaless_writer``, checked
  equal to the serializer's output for that first record (the serializer per record costs
  minutes of set-up at 1M, not a product figure).
* ``naive_avro`` (b): one tuned confluent-kafka consumer, the header stripped and
  ``fastavro.schemaless_reader`` per record (the schema fetched once), one pyarrow table,
  one Parquet file: what a hand-written, non-exactly-once Avro ingester does.
* ``product_avro`` / ``product_json`` (e): the daemon in this process after a 20,000-record
  Avro warm-up, each format run ``WARM_RUNS`` times by new supervisors (each its own table),
  the last run reported (``earlier_runs_records_per_s`` the others); every run verified
  exactly once by key through the catalog.
* ``product_json_typed`` (with ``--typed-json``): the JSON topic read with typed
  dimensions (``{name: bytes_l, type: long, path: bytes}``, ``{name: seen, type:
  timestamp, path: ts}``) beside the same dimensions as strings (``product_json_strings``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ingest import (
    PARTITIONS,
    TASK_COUNT,
    WARMUP_RECORDS,
    _Phases,
    _phases_of,
    _rate,
    _verify,
    naive_records,
)

import devservices
from devservices.registry import Registry

log = logging.getLogger("bench")
WARM_RUNS = 2
SCHEMA = {"type": "record", "name": "Click", "namespace": "bench", "fields": [
    {"name": "id", "type": "string"}, {"name": "ts", "type": "long"}, {"name": "user", "type": "string"},
    {"name": "page", "type": "string"}, {"name": "bytes", "type": "long"}]}
DIMENSIONS = ["id", "user", "page", "__partition", "__offset"]
TYPED = [*DIMENSIONS, {"name": "bytes_l", "type": "long", "path": "bytes"},
         {"name": "seen", "type": "timestamp", "path": "ts"}]
STRINGS = [*DIMENSIONS, {"name": "bytes_l", "path": "bytes"}, {"name": "seen", "path": "ts"}]


def avro_values(registry: Registry, topic: str, records: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The records as Confluent wire-format Avro (see the module docstring)."""
    import fastavro
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = AvroSerializer(SchemaRegistryClient({"url": registry.url}), json.dumps(SCHEMA))
    first = ser(json.loads(records[0][1]), SerializationContext(topic, MessageField.VALUE))
    header, parsed = first[:5], fastavro.parse_schema(SCHEMA)
    out, buf, write, loads = [], io.BytesIO(), fastavro.schemaless_writer, json.loads
    for key, value in records:
        buf.seek(0)
        buf.truncate()
        write(buf, parsed, loads(value))
        out.append((key, header + buf.getvalue()))
    if out[0][1] != first:
        raise RuntimeError("fastavro's body differs from AvroSerializer's: the benchmark's data would be wrong")
    return out


def naive_avro(bootstrap: str, topic: str, ends: dict[int, int], registry_url: str, out: Path) -> dict[str, Any]:
    """One tuned consumer, fastavro's schemaless_reader per record, one table, one file."""
    import fastavro
    import pyarrow as pa
    import pyarrow.parquet as pq
    from confluent_kafka.schema_registry import SchemaRegistryClient

    started = time.perf_counter()
    client = SchemaRegistryClient({"url": registry_url})
    schemas: dict[int, Any] = {}
    cols: dict[str, list] = {"id": [], "ts": [], "user": [], "page": [], "bytes": []}
    parts: list[str] = []
    offsets: list[int] = []
    read = fastavro.schemaless_reader
    for p, o, value in naive_records(bootstrap, topic, ends, f"naive-avro-{os.getpid()}"):
        sid = int.from_bytes(value[1:5], "big")
        if sid not in schemas:
            schemas[sid] = fastavro.parse_schema(json.loads(client.get_schema(sid).schema_str))
        d = read(io.BytesIO(value[5:]), schemas[sid])
        for k, c in cols.items():
            c.append(d.get(k))
        parts.append(str(p))
        offsets.append(o)
    table = pa.table({"__time": pa.array(cols.pop("ts"), pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                      **{k: pa.array(v) for k, v in cols.items()},
                      "__partition": pa.array(parts, pa.string()), "__offset": pa.array(offsets, pa.int64())})
    pq.write_table(table, out)
    return _rate(len(parts), time.perf_counter() - started)


def _spec(sid: str, source: dict[str, Any], fmt: str, dimensions: list, registry_url: str) -> dict[str, Any]:
    ds: dict[str, Any] = {"datasource": sid, "format": fmt, "timestamp": {"column": "ts", "format": "millis"},
                          "dimensions": dimensions,
                          "metrics": [{"name": "bytes", "type": "longSum", "field": "bytes"}],
                          "granularity": {"segment": "hour", "query": "none", "rollup": False}}
    if fmt == "avro":
        ds["avro"] = {"schemaRegistry": {"url": registry_url}}
    return {"id": sid, "source": source, "taskCount": TASK_COUNT, "taskDuration": "1s",
            "maxBatchRecords": 1_000_000, "dataSchema": ds}


class _Warm:
    """The daemon in this process, one fresh state directory per run (the SparkSession and
    its Python workers stay warm between runs, as in a long-running daemon)."""

    def __init__(self, work: Path, registry_url: str, spark_conf: list[str]):
        self.work, self.registry_url, self.phases = work, registry_url, _Phases()
        self.spark_conf = spark_conf

    def run(self, sid: str, source: dict[str, Any], fmt: str, dimensions: list, n: int) -> dict[str, Any]:
        import yaml

        from reconciler import settings as settings_mod
        from reconciler.daemon import Daemon

        self.phases.batches.clear()
        base = self.work / sid
        (base / "specs").mkdir(parents=True)
        (base / "specs" / f"{sid}.yaml").write_text(
            yaml.safe_dump(_spec(sid, source, fmt, dimensions, self.registry_url), sort_keys=False))
        s = settings_mod.load({"specs": str(base / "specs"), "state_dir": str(base / "state"), "http": "",
                               "tick_interval": 1.0, "spark_conf": list(self.spark_conf)}, config=os.devnull, env={})
        sup = logging.getLogger("reconciler.runtime.supervisor")
        sup.addHandler(self.phases)
        t = time.perf_counter()
        try:
            code = Daemon(s).run(until_caught_up=True, timeout=900)
        finally:
            sup.removeHandler(self.phases)
        seconds = time.perf_counter() - t
        if code != 0:
            raise RuntimeError(f"in-process daemon exited {code}")
        return {**_rate(n, seconds), "batch_phases": _phases_of(self.phases.batches),
                "verify": _verify(s.segments_dir, sid, n)}

    def repeated(self, tag: str, source: dict[str, Any], fmt: str, dimensions: list, n: int) -> dict[str, Any]:
        runs = [self.run(f"{tag}-{i}", source, fmt, dimensions, n) for i in range(WARM_RUNS)]
        return {**runs[-1], "earlier_runs_records_per_s": [r["records_per_s"] for r in runs[:-1]]}


def bench_avro(n: int, work: Path, typed_json: bool = False, spark_conf: list[str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {"partitions": PARTITIONS}
    from reconciler.pipeline.formats import registry as sources

    with devservices.TansuBroker() as broker, Registry() as registry:
        sources._FETCHED.clear()
        for name in ("avro", "json", "warmup"):
            broker.create_topic(name, PARTITIONS)
        records = devservices.make_records(n)
        t = time.perf_counter()
        avro = avro_values(registry, "avro", records)
        res["serialize_avro"] = _rate(n, time.perf_counter() - t)
        res["avro_bytes_mean"] = round(sum(len(v) for _, v in avro) / n, 1)
        res["json_bytes_mean"] = round(sum(len(v) for _, v in records) / n, 1)
        log.info("avro: producing %d records to each of avro and json", n)
        t = time.perf_counter()
        ends = devservices.produce_kafka(broker.bootstrap, "avro", avro)
        res["produce_avro"] = _rate(n, time.perf_counter() - t)
        devservices.produce_kafka(broker.bootstrap, "json", records)
        devservices.produce_kafka(broker.bootstrap, "warmup",
                                  avro_values(registry, "warmup", devservices.make_records(WARMUP_RECORDS)))
        del records, avro
        log.info("avro: naive pipeline")
        res["naive_avro"] = naive_avro(broker.bootstrap, "avro", ends, registry.url, work / "naive-avro.parquet")
        source = {"type": "kafka", "bootstrapServers": broker.bootstrap}
        warm = _Warm(work, registry.url, list(spark_conf or ()))
        log.info("avro: product, warm-up")
        warm.run("warmup", {**source, "topic": "warmup"}, "avro", DIMENSIONS, WARMUP_RECORDS)
        log.info("avro: product, Avro")
        res["product_avro"] = warm.repeated("avro", {**source, "topic": "avro"}, "avro", DIMENSIONS, n)
        log.info("avro: product, JSON")
        res["product_json"] = warm.repeated("json", {**source, "topic": "json"}, "json", DIMENSIONS, n)
        if typed_json:
            log.info("avro: product, JSON typed and as strings")
            res["product_json_typed"] = warm.repeated("typed", {**source, "topic": "json"}, "json", TYPED, n)
            res["product_json_strings"] = warm.repeated("strings", {**source, "topic": "json"}, "json", STRINGS, n)
        res["registry_requests"] = dict(registry.requests)

    def r(a: str, b: str) -> float | None:
        x, y = res.get(a, {}).get("records_per_s"), res.get(b, {}).get("records_per_s")
        return round(x / y, 3) if x and y else None

    res["ratios"] = {"avro_over_naive_avro": r("product_avro", "naive_avro"),
                     "avro_over_json": r("product_avro", "product_json"),
                     "typed_over_strings": r("product_json_typed", "product_json_strings")}
    return res
