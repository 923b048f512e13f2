"""Kafka ingestion end to end: real Tansu, real Spark, the daemon in this process.

Every test that ingests reads the committed rows back with
``spark.read.parquet("<segmentsDir>/<datasource>")`` and finds each produced key
exactly once (none missing, none duplicated).
"""

from __future__ import annotations

import collections
import json
import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

import devservices
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

PARTITIONS = 4


@pytest.mark.parametrize(
    "tasks,db",
    [
        pytest.param(1, "sqlite", id="taskCount1-sqlite"),
        pytest.param(3, "postgresql", id="taskCount3-postgresql", marks=pytest.mark.postgres),
    ],
)
def test_every_key_exactly_once(spark, kafka_broker, topic, tmp_path, request, tasks, db):
    """20,000 keyed records over 4 partitions, maxBatchRecords 6,000: several bounded
    batches, every key once, offsets contiguous; status and segments agree with the Parquet."""
    n, max_batch = 20_000, 6_000
    name = topic(partitions=PARTITIONS)
    records = devservices.make_records(n)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    assert sum(ends.values()) == n
    s = h.make_settings(tmp_path, db=h.database(db, request))
    h.write_spec(s.specs, h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name),
                                     task_count=tasks, max_batch_records=max_batch))

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), h.keys(records))
    df = h.read_segments(spark, s, "clicks")
    expected_pos = h.kafka_positions(records, PARTITIONS)
    got_pos = {r.id: (r["__partition"], r["__offset"]) for r in df.select("id", "__partition", "__offset").collect()}
    assert got_pos == expected_pos
    assert df.where(F.col("id") != F.col("__key")).count() == 0

    # maxBatchRecords bounds every batch; the batches tile [0, end) of each partition once
    done = h.batches(s, "clicks")
    assert len(done) >= -(-n // max_batch), done
    assert all(b["records"] <= max_batch and b["status"] == "committed" for b in done)
    assert sum(b["records"] for b in done) == n and sum(b["unparseable"] for b in done) == 0
    h.assert_batches_tile(done, ends)

    # status -o json: per-partition checkpoint, latest, lag
    [st] = h.cli_json(s, "status", "clicks")["supervisors"]
    assert st["records"] == n and st["batches"] == len(done) and st["unparseable"] == 0
    assert st["lag"] == 0 and st["streamError"] is None
    assert {x["partition"]: (x["checkpoint"], x["latest"], x["lag"]) for x in st["partitions"]} == {
        str(p): (end, end, 0) for p, end in ends.items()
    }

    # segments DATASOURCE: committed files, rows matching the Parquet
    segs = h.cli_json(s, "segments", "clicks")
    assert sum(x["rows"] for x in segs) == df.count() == n
    on_disk = sorted(str(p) for p in (s.segments_dir / "default" / "clicks" / "data").rglob("*.parquet"))
    assert sorted(x["path"] for x in segs) == on_disk
    for x in segs:
        assert pq.read_metadata(x["path"]).num_rows == x["rows"]
        assert Path(x["path"]).stat().st_size == x["bytes"]
        assert f"time_chunk={x['segment']}" in x["path"]
    code, text = h.run_cli(s, "segments", "clicks")
    assert code == 0 and f"{len(segs)} file(s), {n} rows" in text
    assert h.staging_leftovers(s) == []


def test_rollup_equals_python(spark, kafka_broker, topic, tmp_path):
    """rollup: true, queryGranularity hour, segment day: the committed rows, summed per
    (hour, user, page), equal the same aggregation done in plain Python."""
    n = 6_000
    name = topic(partitions=3)
    records = devservices.make_records(n, step_ms=45_000)  # 75 hours: several day segments
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path)
    metrics = [
        {"name": "n", "type": "count"},
        {"name": "bytes", "type": "longSum", "field": "bytes"},
        {"name": "maxBytes", "type": "longMax", "field": "bytes"},
        {"name": "minBytes", "type": "longMin", "field": "bytes"},
        {"name": "dbytes", "type": "doubleSum", "field": "bytes"},
    ]
    h.write_spec(s.specs, h.spec_doc(
        "rollup", h.kafka_source(kafka_broker.bootstrap, name), task_count=2,
        dimensions=["user", "page"], metrics=metrics,
        granularity={"segment": "day", "query": "hour", "rollup": True}))

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    expected: dict[tuple, list] = {}
    for _, value in records:
        d = json.loads(value)
        k = (d["ts"] // 3_600_000 * 3_600_000, d["user"], d["page"])
        e = expected.setdefault(k, [0, 0, d["bytes"], d["bytes"], 0.0])
        e[0] += 1
        e[1] += d["bytes"]
        e[2] = max(e[2], d["bytes"])
        e[3] = min(e[3], d["bytes"])
        e[4] += d["bytes"]
    df = h.read_segments(spark, s, "rollup").select(
        F.unix_millis("__time").alias("t"), "user", "page", "n", "bytes", "maxBytes", "minBytes", "dbytes")
    rows = df.collect()
    got: dict[tuple, list] = {}
    for r in rows:  # rows of different batches may share a group: combine them like a query would
        g = got.setdefault((r.t, r.user, r.page), [0, 0, r.maxBytes, r.minBytes, 0.0])
        g[0] += r.n
        g[1] += r.bytes
        g[2] = max(g[2], r.maxBytes)
        g[3] = min(g[3], r.minBytes)
        g[4] += r.dbytes
    assert got == {k: v for k, v in expected.items()}
    assert sum(v[0] for v in got.values()) == n
    done = h.batches(s, "rollup")
    if len(done) == 1:  # one batch: exactly one row per group (the rollup happened)
        assert len(rows) == len(expected)
    assert sum(b["records"] for b in done) == n
    # day partitions: the table's files each hold one day, and every row lies in its file's day
    days = {datetime.fromtimestamp(t // 86_400_000 * 86_400, UTC).strftime("%Y%m%dT0000Z") for t, *_ in expected}
    files = h.cli_json(s, "segments", "rollup")
    assert len(days) >= 3 and {f["segment"] for f in files} == days
    for f in files:
        start, end = (datetime.fromisoformat(f[k].replace("Z", "+00:00")) for k in ("interval_start", "interval_end"))
        assert end - start == timedelta(days=1) and start.strftime("%Y%m%dT0000Z") == f["segment"]
        times = pq.read_table(f["path"], columns=["__time"]).column("__time").to_pylist()
        assert times and all(start <= t < end for t in times)


def test_unparseable_counted_and_dead_lettered(spark, kafka_broker, topic, tmp_path):
    """Non-JSON values and JSON without the timestamp column: counted as unparseable in
    status and batches, kept in the committed dead-letter table at exactly their
    (partition, offset); every good key exactly once."""
    name = topic(partitions=2)
    good = devservices.make_records(3_000)
    not_json = [(f"bad-json-{i}", b"{not json" if i % 2 else b"\xff\xfe binary") for i in range(7)]
    no_ts = [(f"bad-ts-{i}", json.dumps({"id": f"bad-ts-{i}", "user": "u1"}).encode()) for i in range(5)]
    records = good[:1000] + not_json + good[1000:2000] + no_ts + good[2000:]
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    pos = h.kafka_positions(records, 2)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("dirty", h.kafka_source(kafka_broker.bootstrap, name), task_count=2,
                                     max_batch_records=1_500))

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "dirty"), h.keys(good))
    bad_keys = h.keys(not_json) + h.keys(no_ts)
    dead = h.deadletters(spark, s, "dirty")
    assert sorted((p, o) for p, o, _ in dead) == sorted(pos[k] for k in bad_keys)
    reasons = {(p, o): why for p, o, why in dead}
    for k in h.keys(not_json):
        assert reasons[pos[k]] == "invalid JSON: not a JSON object"
    for k in h.keys(no_ts):
        assert reasons[pos[k]] == "missing timestamp column 'ts'"
    dead_rows = h.table_rows(s, "dirty_deadletter", ["key", "value"]).to_pylist()  # through the catalog
    assert sorted(r["key"].decode() for r in dead_rows) == sorted(bad_keys)
    assert {r["key"].decode(): r["value"] for r in dead_rows} == {k.decode() if isinstance(k, bytes) else k: v
                                                                 for k, v in not_json + no_ts}

    [st] = h.cli_json(s, "status", "dirty")["supervisors"]
    assert st["unparseable"] == len(bad_keys) == 12
    assert st["records"] == len(records)
    done = h.batches(s, "dirty")
    assert sum(b["unparseable"] for b in done) == 12 and sum(b["rows"] for b in done) == len(good)
    assert h.staging_leftovers(s) == []


def test_start_from_latest_only_without_checkpoint(spark, kafka_broker, topic, tmp_path):
    """startFrom: latest skips what was there before the first start; later runs, and a
    changed startFrom, continue from the checkpoint. IDLE when nothing is new; status
    shows the lag of records produced since."""
    name = topic(partitions=2)
    before = devservices.make_records(1_000, start=0)
    devservices.produce_kafka(kafka_broker.bootstrap, name, before)
    s = h.make_settings(tmp_path)
    source = h.kafka_source(kafka_broker.bootstrap, name)
    h.write_spec(s.specs, h.spec_doc("late", source, start_from="latest"))

    code, _ = h.run_daemon(s, timeout=120)
    assert code == 0
    assert h.key_counts(spark, s, "late") == collections.Counter()
    [st] = h.cli_json(s, "status", "late")["supervisors"]
    assert {x["partition"]: x["checkpoint"] for x in st["partitions"]} == {
        x["partition"]: x["latest"] for x in st["partitions"]}
    assert sum(x["checkpoint"] for x in st["partitions"]) == 1_000 and st["lag"] == 0

    # nothing new: the supervisor goes IDLE and runs no batch
    code, _ = h.run_daemon(s, until_caught_up=False, timeout=4.0)
    [st] = h.cli_json(s, "status", "late")["supervisors"]
    assert (st["state"], st["detailedState"], st["batches"]) == ("IDLE", "IDLE", 0)

    after = devservices.make_records(1_500, start=1_000)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, after)
    [st] = h.cli_json(s, "status", "late")["supervisors"]
    assert st["lag"] == 1_500
    assert {x["partition"]: x["latest"] for x in st["partitions"]} == {str(p): e for p, e in ends.items()}

    # a changed startFrom does not move an existing checkpoint
    h.write_spec(s.specs, h.spec_doc("late", source, start_from="earliest", task_count=2))
    code, _ = h.run_daemon(s, timeout=120)
    assert code == 0
    h.assert_exactly_once(h.key_counts(spark, s, "late"), h.keys(after))
    [st] = h.cli_json(s, "status", "late")["supervisors"]
    assert st["lag"] == 0 and st["records"] == 1_500


def test_unhealthy_after_repeated_failures_with_backoff(spark, kafka_broker, topic, tmp_path, caplog):
    """A topic that does not exist: each step fails, retries back off (0.5 s * 2^n), the
    third failure reports UNHEALTHY_SUPERVISOR with the error; once the topic exists the
    same supervisor recovers and ingests every key once."""
    name = f"missing-{tmp_path.name[-20:].lower().replace('_', '-')}"
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("flaky", h.kafka_source(kafka_broker.bootstrap, name)))

    caplog.set_level(logging.DEBUG, logger="reconciler.runtime.supervisor")  # the retries after the first are DEBUG
    code, _ = h.run_daemon(s, timeout=6.0)
    assert code == 1  # never caught up: the stream cannot be read
    retries = [re.search(r"\(failure (\d+), retry in ([0-9.]+)s\)", r.getMessage()) for r in caplog.records
               if r.name == "reconciler.runtime.supervisor" and getattr(r, "supervisor", None) == "flaky"]
    retries = [(int(m[1]), float(m[2])) for m in retries if m]
    # backoff 1 s, 2 s, 4 s: 3 or 4 attempts in 6 s (without it, dozens)
    assert retries[:3] == [(1, 1.0), (2, 2.0), (3, 4.0)] and len(retries) <= 4, retries
    [st] = h.cli_json(s, "status", "flaky")["supervisors"]
    assert st["state"] == "UNHEALTHY_SUPERVISOR"
    assert st["detailedState"] == "UNABLE_TO_CONNECT_TO_STREAM"
    assert name in st["lastError"] and "does not exist" in st["lastError"]
    assert st["streamError"] and st["lag"] is None  # unknown, never a false 0

    kafka_broker.create_topic(name, 2)
    try:
        records = devservices.make_records(2_000)
        devservices.produce_kafka(kafka_broker.bootstrap, name, records)
        code, _ = h.run_daemon(s, timeout=120)
        assert code == 0
        h.assert_exactly_once(h.key_counts(spark, s, "flaky"), h.keys(records))
        [st] = h.cli_json(s, "status", "flaky")["supervisors"]
        assert st["state"] in ("RUNNING", "IDLE") and st["lastError"] is None and st["lag"] == 0
    finally:
        kafka_broker.delete_topic(name, timeout=10)


def test_max_batch_bytes_bounds_batches_by_the_measured_record_size(spark, kafka_broker, topic, tmp_path):
    """maxBatchBytes 64 KiB, ~105-byte records: the first batch assumes 512 bytes a record
    (128 records), later batches use the mean size measured (about 620 records each). Every
    batch stays within the bound as measured, every key once."""
    n = 3_000
    name = topic(partitions=2)
    records = devservices.make_records(n)
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("sized", h.kafka_source(kafka_broker.bootstrap, name), task_count=2,
                                     maxBatchBytes="64KiB"))

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "sized"), h.keys(records))
    size = {k: len(k) + len(v) for k, v in records}
    mean = sum(size.values()) / n
    done = sorted(h.batches(s, "sized"), key=lambda b: b["committed_at"])
    assert done[0]["records"] == 65536 // 512
    assert all(b["records"] * mean <= 65536 * 1.05 for b in done), [b["records"] for b in done]
    assert max(b["records"] for b in done[1:]) > 65536 // 512  # measured records are smaller than assumed
    assert sum(b["records"] for b in done) == n
