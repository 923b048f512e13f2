"""Issue 45: the daemon's rolling compaction keeps the open time partition small while
records flow, and every record is in the table exactly once by key.

A real Tansu broker, the daemon in this process on the session's Spark, a batch every
300 ms into the current hour (event time now), ``rollingCompaction: 2`` s. While the
producer writes, the live files of the open partition are sampled from the table's
current snapshot: without the rolling compaction they grow by a few files a commit (the
check at the end shows how many batches committed); with it they stay bounded."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

import devservices
from reconciler.store.store import Store
from reconciler.table import compact as mc
from tests.e2e import helpers as h
from tests.e2e.test_reset_race import BackgroundDaemon, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

SID = "rolling"
BOUND = 40  # 2 s of commits (a few files each) + the last 3 commits' + the merged file(s)
SECONDS = 40.0


def open_partition_files(s) -> int:
    """The most live data files any time partition still open (its end less than an hour
    ago) holds in the table's current snapshot."""
    tables = h.open_tables(s)
    try:
        table = tables.load(SID)
        if table is None or table.current_snapshot() is None:
            return 0
        spec, time_id = table.metadata.spec(), mc.time_field_id(table.metadata.schema())
        now, per = datetime.now(UTC), {}
        for task in table.scan().plan_files():
            _, end = mc.time_interval(spec, task.file.partition, time_id)
            if end is not None and end + timedelta(hours=1) > now:
                per[tuple(task.file.partition)] = per.get(tuple(task.file.partition), 0) + 1
        return max(per.values(), default=0)
    finally:
        tables.catalog.engine.dispose()


def test_the_open_partition_stays_small_while_ingesting_exactly_once(spark, kafka_broker, topic, tmp_path, capsys):
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, rolling_compaction=2.0)
    h.write_spec(s.specs, h.spec_doc(SID, h.kafka_source(kafka_broker.bootstrap, name), task_duration="300ms",
                                     task_count=2))
    sent = [0]
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            records = devservices.make_records(20, start=sent[0], ts_start_ms=int(time.time() * 1000), step_ms=1)
            devservices.produce_kafka(kafka_broker.bootstrap, name, records)
            sent[0] += 20
            stop.wait(0.1)

    producer = threading.Thread(target=produce, name="producer", daemon=True)
    store = Store(s.db_url)
    samples: list[int] = []
    try:
        with BackgroundDaemon(s) as bg:
            producer.start()
            began = time.monotonic()
            while time.monotonic() - began < SECONDS:
                time.sleep(1.0)
                samples.append(open_partition_files(s))
            stop.set()
            producer.join(60)
            wait_for(lambda: sum(store.checkpoints(SID).values()) >= sent[0], 180, "every record committed",
                     every=0.2)
            compactor = bg.daemon.manager.compactor
            rolled = compactor.rolling_runs
    finally:
        stop.set()
        store.close()
    batches = h.batches(s, SID)
    with capsys.disabled():
        print(f"\nrolling compaction: {sent[0]} records, {len(batches)} batches, {rolled} rolling runs, "
              f"open partition files every second: {samples}")
    # Without the merge the open partition would hold at least a file per batch: beyond the bound.
    assert len(batches) > BOUND, len(batches)
    assert rolled >= 3
    assert max(samples[5:]) <= BOUND, samples
    h.assert_exactly_once(h.key_counts(spark, s, SID), [f"k{i:06d}" for i in range(sent[0])])
    assert h.staging_leftovers(s) == []
    ok = h.run_subprocess(s, "verify", SID)
    assert ok.returncode == 0, ok.stdout + ok.stderr
