"""The warehouse on object storage (issue 31), end to end: real Tansu broker, real Spark
(local), a real S3-protocol server (moto's server mode, ``s3_server``), SQLite catalog.

``segments`` is ``s3://bucket/prefix`` and the daemon has only the standard AWS environment
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION). Every record is
read back from the bucket with pyiceberg and counted by key; the table's data and metadata
are objects in the bucket and none is on local disk.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

import devservices
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

TS0 = devservices.DEFAULT_TS_START_MS
TABLE_FILES = (".parquet", ".metadata.json", ".avro")


def key_range(start: int, n: int) -> list[str]:
    return [f"k{i:06d}" for i in range(start, start + n)]


def produce(broker, name: str, start: int, n: int) -> dict[int, int]:
    return devservices.produce_kafka(broker.bootstrap, name, devservices.make_records(
        n, start=start, ts_start_ms=TS0 + start * 1000, step_ms=1000))


def daemon(settings, timeout: float = 180.0) -> None:
    code, _ = h.run_daemon(settings, timeout=timeout)
    assert code == 0, "the daemon did not catch up in time"


def local_table_files(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and p.name.endswith(TABLE_FILES))


def test_ingest_reset_backfill_compact_maintain_on_a_bucket(spark, kafka_broker, topic, s3_server, s3_bucket,
                                                            tmp_path):
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, segments=f"s3://{s3_bucket}/warehouse")
    assert s.remote_warehouse and s.warehouse == f"s3://{s3_bucket}/warehouse"
    doc = h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name, **{"fetch.queue.backoff.ms": 10}),
                     task_count=2)
    h.write_spec(Path(s.specs), doc)
    produce(kafka_broker, name, 0, 2000)
    daemon(s)
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 2000))

    # The daemon is down and the main supervisor falls behind: reset to latest with a backfill.
    produce(kafka_broker, name, 2000, 3000)
    code, out = h.run_cli(s, "reset", "clicks", "--to", "latest", "--backfill", "--reason", "s3", "-o", "json")
    assert code == 0, out
    assert json.loads(out)["backfill"] == "clicks-backfill-1"
    daemon(s)
    final = produce(kafka_broker, name, 5000, 500)
    daemon(s)
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 5500))
    store = Store(s.db_url)
    try:
        assert str(store.get("clicks-backfill-1").state) == "COMPLETED"
    finally:
        store.close()

    # Compaction rewrites the closed partitions' small files on the bucket, one commit.
    files_before = len(h.table_rows(s, "clicks", ["id"]) or [])
    code, out = h.run_cli(s, "compact", "clicks", "--lateness", "0s", "-o", "json")
    assert code == 0, out
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 5500))
    assert files_before == 5500

    # Expiry and orphan clean-up on the bucket: an unreferenced object of a discarded write
    # goes; the table still reads every key once.
    code, out = h.run_cli(s, "maintain", "clicks", "--older-than", "0s", "--retain-last", "1",
                          "--orphans-older-than", "0s", "-o", "json")
    assert code == 0, out
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 5500))

    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert report["ok"] and report["findings"] == [], report
    assert report["deep"]["duplicateOffsets"] == 0 and report["deep"]["rows"] == 5500
    assert {(c["partition"], c["start"], c["end"]) for c in report["coverage"]} == {
        (str(p), 0, e) for p, e in final.items()}

    # Everything of the table is an object in the bucket; nothing of it on local disk.
    keys = s3_server.keys(s3_bucket, "warehouse/default/clicks/")
    assert any(k.endswith(".parquet") and "/data/" in k for k in keys), keys
    assert any(k.endswith(".metadata.json") and "/metadata/" in k for k in keys), keys
    assert any(k.endswith(".avro") for k in keys), keys
    assert not any("/_staging/" in k or k.endswith("_committed.json") and "batch=" not in k for k in keys)
    assert local_table_files(tmp_path) == []
    assert not (tmp_path / "state" / "segments").exists()
    tables = h.open_tables(s)
    try:
        assert tables.load("clicks").metadata_location.startswith(f"s3://{s3_bucket}/warehouse/default/clicks/")
    finally:
        tables.catalog.engine.dispose()
    # Another reader: pyiceberg's own SqlCatalog over the same database, the bucket reached
    # with the same settings as the README shows, every key once.
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("reconciler", uri=s.db_url, warehouse=s.warehouse,
                         **{"s3.endpoint": s3_server.endpoint, "s3.region": "us-east-1"})
    ids = catalog.load_table("default.clicks").scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    h.assert_exactly_once(collections.Counter(ids), key_range(0, 5500))


def test_the_store_going_away_mid_batch_then_coming_back(spark, kafka_broker, topic, s3_server, s3_bucket,
                                                         tmp_path, caplog):
    """The store goes away after a batch wrote its files, before its publish: the supervisor
    turns UNHEALTHY with the store's reason and publishes nothing; once the store is back it
    catches up, every key once, and the lost batch's objects are cleaned up by its fence."""
    from reconciler import faults

    name = topic(partitions=2)
    s = h.make_settings(tmp_path, segments=f"s3://{s3_bucket}/wh")
    h.write_spec(Path(s.specs), h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name,
                                                                     **{"fetch.queue.backoff.ms": 10})))
    produce(kafka_broker, name, 0, 1000)
    daemon(s)
    produce(kafka_broker, name, 1000, 1000)

    gone: list[str] = []

    def away(point: str, subject) -> None:
        if point == "after-write" and not gone:
            gone.append(str(subject))
            s3_server.go_away()

    faults.install(away)
    try:
        code, _ = h.run_daemon(s, until_caught_up=False, timeout=20.0)
    finally:
        faults.install(None)
        if not gone:
            s3_server.come_back()
    assert gone == ["clicks"], "no batch reached its publish"
    store = Store(s.db_url)
    try:
        rec = store.get("clicks")
        assert str(rec.state).startswith("UNHEALTHY"), rec.state
        status = h.cli_json(s, "status", "clicks")["supervisors"][0]
        error = json.dumps(status)
        assert f"the warehouse's object store {s3_server.endpoint} failed" in error, error
        assert "NETWORK_CONNECTION" in error and "Traceback" not in error, error
        assert sum(store.checkpoints("clicks").values()) == 1000  # nothing published meanwhile
        s3_server.come_back()
        daemon(s)
        assert sum(store.checkpoints("clicks").values()) == 2000
    finally:
        store.close()
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 2000))
    secret = s3_server.env()["AWS_SECRET_ACCESS_KEY"]
    assert secret not in caplog.text and secret not in json.dumps(spark.sparkContext.getConf().getAll())
    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert report["ok"] and report["deep"]["duplicateOffsets"] == 0 and report["deep"]["rows"] == 2000
    # The batch the outage interrupted was fenced; orphan clean-up deletes what it left.
    code, out = h.run_cli(s, "maintain", "clicks", "--no-expire", "--orphans-older-than", "0s", "-o", "json")
    assert code == 0, out
    referenced = {f.file_path for f in h.open_tables(s).load("clicks").scan().plan_files() for f in [f.file]}
    parquet = {f"s3://{s3_bucket}/{k}" for k in s3_server.keys(s3_bucket, "wh/default/clicks/data/")
               if k.endswith(".parquet")}
    assert parquet == referenced
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 2000))
