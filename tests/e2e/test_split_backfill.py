"""A backfill of ONE partition read by two tasks at once, end to end (issue 30).

A bounded supervisor's ``taskCount`` cuts each partition's range into that many offset
sub-ranges (``runtime.batching.batch_tasks`` + ``pipeline.sources.split_ranges``), so one
partition drains in parallel. Exactly once must hold per sub-range: the publish commits
every task's files and the checkpoint at the range's end in one transaction, each
(partition, offset) lands once, and ``reconciler verify --deep`` proves it from the table
alone with several files per partition and time chunk. Real Tansu / RabbitMQ, real Spark,
real database.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import devservices
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TS0 = devservices.DEFAULT_TS_START_MS
TASK = re.compile(r"/part-(\d{5})-\d+-[0-9a-f]+\.parquet$")  # the sink's name: part-<task>-<attempt>-<uuid>


def daemon(settings, timeout: float = 180.0) -> None:
    code, _ = h.run_daemon(settings, timeout=timeout)
    assert code == 0, "the daemon did not catch up in time"


def key_range(start: int, n: int) -> list[str]:
    return [f"k{i:06d}" for i in range(start, start + n)]


def offsets_by_task(store: Store, datasource: str, supervisor_id: str) -> dict[str, list[tuple[int, int]]]:
    """Spark task -> the (first, last) ``__offset`` of each file it wrote for ``supervisor_id``."""
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for seg in store.segments(datasource):
        if seg["supervisor_id"] != supervisor_id:
            continue
        m = TASK.search(seg["path"])
        assert m, seg["path"]
        offsets = pq.read_table(seg["path"], columns=["__offset"]).column("__offset").to_pylist()
        out[m.group(1)].append((min(offsets), max(offsets)))
    return dict(out)


def assert_verified(settings, datasource: str, rows: int, coverage: set[tuple[str, int, int]]) -> None:
    """From the table alone: the batches tile every offset, and no offset is held twice."""
    report = h.cli_json(settings, "verify", datasource, "--deep")
    assert report["ok"] and report["findings"] == [], report
    assert {(c["partition"], c["start"], c["end"]) for c in report["coverage"]} == coverage
    assert report["deep"]["duplicateOffsets"] == 0 and report["deep"]["rows"] == rows, report["deep"]
    # Each batch says how many records its tasks' readers delivered per partition, summed over
    # its sub-ranges: what lets deep verify tell a record missing from an offset without one.
    from reconciler.table.summary import summary_ranges, summary_read

    tables = h.open_tables(settings)
    delivered = 0
    try:
        for snap in tables.load(datasource).snapshots():
            props = snap.summary.additional_properties if snap.summary else {}
            if summary_ranges(props):
                read = summary_read(props)
                assert read is not None and set(read) <= {p for p, _, _ in summary_ranges(props)}, props
                delivered += sum(read.values())
    finally:
        tables.catalog.engine.dispose()
    assert delivered == rows  # every delivered record is a row (these streams hold no dead letter)


@pytest.mark.kafka
def test_kafka_backfill_of_one_partition_in_two_sub_ranges_the_first_ending_on_a_marker(
        spark, kafka_broker, topic, tmp_path):
    from confluent_kafka import Producer

    name = topic(partitions=1)
    bootstrap = kafka_broker.bootstrap

    def produce(start: int, n: int) -> None:
        devservices.produce_kafka(bootstrap, name, devservices.make_records(n, start=start, ts_start_ms=TS0 + start * 1000))

    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("one", h.kafka_source(bootstrap, name, **{"fetch.queue.backoff.ms": 10})))
    produce(0, 1000)
    daemon(s)

    # The daemon is down; 5000 offsets arrive: records at 1000..3497, one transaction's record at
    # 3498 and its commit marker at 3499 (an offset no record has), records at 3500..5999. The
    # backfill [1000, 6000) with taskCount 2 is cut at 3500: the first sub-range ends in the gap.
    produce(1000, 2498)
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{name}", "batch.num.messages": 1,
                   "linger.ms": 0})
    tx.init_transactions(30)
    tx.begin_transaction()
    [(key, value)] = devservices.make_records(1, start=3498, ts_start_ms=TS0 + 3498 * 1000)
    tx.produce(name, key=key.encode(), value=value, partition=0)
    tx.commit_transaction(30)
    produce(3499, 2500)

    out = h.cli_json(s, "reset", "one", "--to", "latest", "--backfill", "--backfill-task-count", "2",
                     "--reason", "split backfill")
    assert out["backfill"] == "one-backfill-1"
    daemon(s)

    store = Store(s.db_url)
    try:
        h.assert_exactly_once(h.key_counts(spark, s, "one"), key_range(0, 5999))
        [batch] = h.batches(s, "one-backfill-1")  # one batch: one publish for both sub-ranges
        assert batch["ranges"] == [("0", 1000, 6000)]
        assert store.checkpoints("one-backfill-1") == {"0": 6000}  # the last sub-range's end
        assert str(store.get("one-backfill-1").state) == "COMPLETED"
        assert store.checkpoints("one") == {"0": 6000}
        tasks = offsets_by_task(store, "one", "one-backfill-1")
        assert sorted(tasks) == ["00000", "00001"], tasks  # two readers of one partition
        assert all(hi < 3500 for _, hi in tasks["00000"]) and all(lo >= 3500 for lo, _ in tasks["00001"]), tasks
        assert sum(len(files) for files in tasks.values()) > 2  # several files per (partition, time chunk)
        assert_verified(s, "one", 5999, {("0", 0, 6000)})
    finally:
        store.close()


@pytest.mark.rabbitmq
def test_rabbitmq_backfill_of_one_stream_in_two_sub_ranges_the_second_starting_mid_chunk(
        spark, rabbit_node, stream, tmp_path):
    name = stream()

    def produce(start: int, n: int) -> None:
        records = devservices.make_records(n, start=start, ts_start_ms=TS0 + start * 1000)
        assert devservices.produce_rabbit(rabbit_node.stream_uri, name, records) == n

    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("orders", h.rabbit_source(rabbit_node.stream_uri, [name])))
    produce(0, 1000)
    daemon(s)
    produce(1000, 4100)  # published 500 at a time: the cut at 3050 is no batch boundary
    out = h.cli_json(s, "reset", "orders", "--to", "latest", "--backfill-task-count", "2", "--reason", "split")
    assert out["backfill"] == "orders-backfill-1" and out["backfillRecords"] == 4100
    daemon(s)

    store = Store(s.db_url)
    try:
        h.assert_exactly_once(h.key_counts(spark, s, "orders"), key_range(0, 5100))
        [batch] = h.batches(s, "orders-backfill-1")
        assert batch["ranges"] == [(name, 1000, 5100)]
        assert store.checkpoints("orders-backfill-1") == {name: 5100}
        tasks = offsets_by_task(store, "orders", "orders-backfill-1")
        assert sorted(tasks) == ["00000", "00001"], tasks
        assert all(hi < 3050 for _, hi in tasks["00000"]) and all(lo >= 3050 for lo, _ in tasks["00001"]), tasks
        assert_verified(s, "orders", 5100, {(name, 0, 5100)})
        assert not list(Path(s.specs).glob("*backfill*"))
    finally:
        store.close()
