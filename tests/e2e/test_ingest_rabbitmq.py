"""RabbitMQ Streams ingestion end to end: a real RabbitMQ node, real Spark, the daemon
in this process. Each stream of a supervisor's set is one partition; a new stream's
offsets start at 0, so the offset of the i-th record published to it is i.
"""

from __future__ import annotations

import collections
import json
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

import devservices
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq, pytest.mark.spark]


def produce_split(uri: str, streams: list[str], records, *, amqp_port: int | None = None) -> dict[str, list]:
    """Publish each record to streams[crc32(key) % len]; returns what each stream got, in order.
    With ``amqp_port`` through AMQP 0.9.1 (pika), as most applications publish; else rstream."""
    per: dict[str, list] = {s: [] for s in streams}
    for rec in records:
        per[streams[zlib.crc32(rec[0].encode()) % len(streams)]].append(rec)
    for s, recs in per.items():
        if amqp_port is not None:
            assert devservices.publish_amqp("127.0.0.1", amqp_port, s, recs) == len(recs)
        else:
            assert devservices.produce_rabbit(uri, s, recs) == len(recs)
    return per


@pytest.mark.parametrize(
    "tasks,db",
    [
        pytest.param(1, "sqlite", id="taskCount1-sqlite"),
        pytest.param(3, "postgresql", id="taskCount3-postgresql", marks=pytest.mark.postgres),
    ],
)
def test_every_key_exactly_once(spark, rabbit_node, stream, tmp_path, request, tasks, db):
    """12,000 keyed records over 3 streams, maxBatchRecords 5,000: several batches, every
    key once at its (stream, offset); status and segments agree with the table's files.
    The first variant's records are published with pika (AMQP 0.9.1), the second's with
    the stream protocol."""
    n, max_batch = 12_000, 5_000
    streams = [stream(), stream(), stream()]
    records = devservices.make_records(n)
    per = produce_split(rabbit_node.stream_uri, streams, records,
                        amqp_port=rabbit_node.amqp_port if tasks == 1 else None)
    s = h.make_settings(tmp_path, db=h.database(db, request))
    h.write_spec(s.specs, h.spec_doc("orders", h.rabbit_source(rabbit_node.stream_uri, streams),
                                     task_count=tasks, max_batch_records=max_batch))

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "orders"), h.keys(records))
    df = h.read_segments(spark, s, "orders")
    expected_pos = {k: (st, i) for st, recs in per.items() for i, (k, _) in enumerate(recs)}
    got_pos = {r.id: (r["__partition"], r["__offset"]) for r in df.select("id", "__partition", "__offset").collect()}
    assert got_pos == expected_pos
    assert df.where(F.col("id") != F.col("__key")).count() == 0  # message_id is the key

    done = h.batches(s, "orders")
    assert len(done) >= -(-n // max_batch)
    assert all(b["records"] <= max_batch for b in done) and sum(b["records"] for b in done) == n
    h.assert_batches_tile(done, {name: len(recs) for name, recs in per.items()})

    [st] = h.cli_json(s, "status", "orders")["supervisors"]
    assert st["records"] == n and st["lag"] == 0 and st["batches"] == len(done)
    assert {x["partition"]: (x["checkpoint"], x["latest"], x["lag"]) for x in st["partitions"]} == {
        name: (len(recs), len(recs), 0) for name, recs in per.items()
    }
    segs = h.cli_json(s, "segments", "orders")
    assert sum(x["rows"] for x in segs) == df.count() == n
    on_disk = sorted(str(p) for p in (s.segments_dir / "default" / "orders" / "data").rglob("*.parquet"))
    assert sorted(x["path"] for x in segs) == on_disk  # every file on disk is committed: nothing dangles
    for x in segs:
        assert pq.read_metadata(x["path"]).num_rows == x["rows"] and Path(x["path"]).stat().st_size == x["bytes"]
    assert h.staging_leftovers(s) == []


def test_rollup_and_dead_letters(spark, rabbit_node, stream, tmp_path):
    """A rollup datasource fed good and unparseable messages: the rolled-up rows equal a
    plain Python aggregation of the good records, and the bad ones are counted and kept
    in the dead-letter Parquet at exactly their (stream, offset)."""
    name = stream()
    good = devservices.make_records(4_000, step_ms=30_000)
    bad = [(f"bad-{i}", b"<xml/>" if i % 3 else json.dumps({"id": f"bad-{i}", "ts": "yesterday"}).encode())
           for i in range(9)]
    no_ts = [(f"nots-{i}", json.dumps({"id": f"nots-{i}", "user": "u0", "bytes": 5}).encode()) for i in range(4)]
    records = good[:1500] + bad[:5] + good[1500:3000] + no_ts + bad[5:] + good[3000:]
    assert devservices.produce_rabbit(rabbit_node.stream_uri, name, records) == len(records)
    offset_of = {k: i for i, (k, _) in enumerate(records)}
    s = h.make_settings(tmp_path)
    metrics = [{"name": "n", "type": "count"}, {"name": "bytes", "type": "longSum", "field": "bytes"}]
    h.write_spec(s.specs, h.spec_doc(
        "events", h.rabbit_source(rabbit_node.stream_uri, [name]), task_count=2, dimensions=["user"],
        metrics=metrics, granularity={"segment": "day", "query": "hour", "rollup": True}))

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    expected: dict[tuple, list] = collections.defaultdict(lambda: [0, 0])
    for _, v in good:
        d = json.loads(v)
        e = expected[(d["ts"] // 3_600_000 * 3_600_000, d["user"])]
        e[0] += 1
        e[1] += d["bytes"]
    got: dict[tuple, list] = collections.defaultdict(lambda: [0, 0])
    rows = h.read_segments(spark, s, "events").select(F.unix_millis("__time").alias("t"), "user", "n", "bytes").collect()
    for r in rows:
        g = got[(r.t, r.user)]
        g[0] += r.n
        g[1] += r.bytes
    assert dict(got) == dict(expected)

    bad_keys = h.keys(bad) + h.keys(no_ts)
    dead = h.deadletters(spark, s, "events")
    assert [(p, o) for p, o, _ in dead] == sorted((name, offset_of[k]) for k in bad_keys)
    reasons = {o: why for _, o, why in dead}
    assert reasons[offset_of["bad-0"]] == "unparseable timestamp (millis): yesterday"
    assert reasons[offset_of["bad-1"]] == "invalid JSON: not a JSON object"
    assert reasons[offset_of["nots-0"]] == "missing timestamp column 'ts'"
    [st] = h.cli_json(s, "status", "events")["supervisors"]
    assert st["unparseable"] == len(bad_keys) == 13 and st["records"] == len(records)
    assert sum(b["unparseable"] for b in h.batches(s, "events")) == 13


def test_start_from_latest_then_new_records(spark, rabbit_node, stream, tmp_path):
    """startFrom: latest on streams that already hold records starts at their committed
    end; records published afterwards are ingested exactly once."""
    streams = [stream(), stream()]
    before = devservices.make_records(800)
    produce_split(rabbit_node.stream_uri, streams, before)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("tail", h.rabbit_source(rabbit_node.stream_uri, streams),
                                     start_from="latest", task_count=2))
    code, _ = h.run_daemon(s, timeout=120)
    assert code == 0
    assert h.key_counts(spark, s, "tail") == collections.Counter()
    [st] = h.cli_json(s, "status", "tail")["supervisors"]
    assert sum(x["checkpoint"] for x in st["partitions"]) == 800 and st["lag"] == 0

    after = devservices.make_records(1_200, start=800)
    produce_split(rabbit_node.stream_uri, streams, after)
    [st] = h.cli_json(s, "status", "tail")["supervisors"]
    assert st["lag"] == 1_200
    code, _ = h.run_daemon(s, timeout=120)
    assert code == 0
    h.assert_exactly_once(h.key_counts(spark, s, "tail"), h.keys(after))
