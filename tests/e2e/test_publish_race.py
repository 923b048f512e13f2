"""Two publishers racing on the same start offsets: one wins, the other's files never
become visible. Real Tansu, real Spark, SQLite and PostgreSQL.

A watcher thread reads the table through the catalog every few milliseconds during the
race and records every batch it ever sees, with its rows: only the winner's may appear,
and only whole.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import devservices
from reconciler.errors import PublishConflict
from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.pipeline import segments as seg
from reconciler.pipeline.batch import output_schemas, run_batch
from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime
from reconciler.store.store import SegmentFile, Store
from reconciler.table.writeids import new_write_id
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

DBS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


def _setup(kafka_broker, topic, tmp_path, request, db, n=4_000):
    name = topic(partitions=2)
    records = devservices.make_records(n)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path, db=h.database(db, request))
    spec = SupervisorSpec.from_document(
        h.spec_doc("race", h.kafka_source(kafka_broker.bootstrap, name), task_count=2))
    store = Store(s.db_url)
    store.migrate()
    store.create_supervisor(spec, None, actor="test")
    return s, spec, store, records, ends


@pytest.mark.parametrize("db", DBS)
def test_two_publishers_same_start_one_wins(spark, kafka_broker, topic, tmp_path, request, db):
    """Two batches staged from the same checkpoint, published at the same moment from two
    threads with their own database connections: exactly one publish commits; the loser
    gets PublishConflict, its staging dir is discarded and none of its files is ever seen."""
    s, spec, store, records, ends = _setup(kafka_broker, topic, tmp_path, request, db)
    store.init_checkpoints("race", dict.fromkeys(map(str, ends), 0))
    ranges = [PartitionRange(str(p), 0, e) for p, e in ends.items()]
    tables = h.open_tables(s)
    ds = spec.data_schema
    schema, dead_schema = output_schemas(spark, ds)
    table = tables.ensure("race", schema, ds.segment_granularity)
    dead = tables.ensure("race_deadletter", dead_schema, None)
    dirs = {b: (tables.data_dir(table, b), tables.data_dir(dead, b)) for b in ("pub-a", "pub-b")}
    staged = {b: run_batch(spark, spec, ranges, b, data_dir=dirs[b][0], dead_dir=dirs[b][1], task_count=2)
              for b in dirs}
    assert all(x.rows == len(records) for x in staged.values())

    gate = threading.Barrier(2, timeout=60)
    outcome: dict[str, str] = {}

    def publish(batch_id: str) -> None:
        mine = Store(s.db_url)  # like a second process: its own engine and connections
        try:
            st = staged[batch_id]
            summary = {"reconciler.supervisor": "race", "reconciler.batch-id": batch_id, "reconciler.epoch": "1",
                       "reconciler.ranges": json.dumps([[r.partition, r.start, r.end] for r in ranges])}
            commit = h.open_tables(s).stage_append("race", [f.path for f in st.files], summary,
                                                     write_id=new_write_id())
            files = [SegmentFile(f.segment or "", "", "", f.path, f.rows, f.bytes) for f in st.files]
            gate.wait()
            try:
                mine.publish(supervisor_id="race", epoch=1, batch_id=batch_id, datasource="race", ranges=ranges,
                             files=files, records=len(records), unparseable=st.dead_rows, table_commits=[commit])
            except PublishConflict as exc:
                seg.discard(*dirs[batch_id])
                outcome[batch_id] = f"lost: {exc}"
                return
            outcome[batch_id] = "won"
        finally:
            mine.close()

    with h.TableWatcher(s, "race") as watcher:
        threads = [threading.Thread(target=publish, args=(b,)) for b in staged]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)

    winners = [b for b, o in outcome.items() if o == "won"]
    losers = [b for b, o in outcome.items() if o.startswith("lost")]
    assert len(winners) == 1 and len(losers) == 1, outcome
    [winner], [loser] = winners, losers
    assert "checkpoint is no longer 0" in outcome[loser]
    assert watcher.seen == {winner}
    watcher.check()
    assert not any(Path(f.path).exists() for f in staged[loser].files)
    assert h.staging_leftovers(s) == []
    assert [b["batch_id"] for b in h.batches(s)] == [winner]
    assert store.checkpoints("race") == {str(p): e for p, e in ends.items()}
    h.assert_exactly_once(h.key_counts(spark, s, "race"), h.keys(records))
    store.close()


@pytest.mark.parametrize("db", DBS)
def test_two_runtimes_race_then_catch_up(spark, kafka_broker, topic, tmp_path, request, db):
    """Two supervisor runtimes (as two daemons would run them) step the same supervisor
    at once; both cut the same ranges (a gate holds each until both have), both run the
    Spark batch, one publishes, the other loses the compare-and-swap and discards its
    output. Stepping on until caught up ingests every key exactly once."""
    s, spec, store, records, ends = _setup(kafka_broker, topic, tmp_path, request, db, n=6_000)
    gate = threading.Barrier(2, timeout=60)
    gated = threading.Event()
    gated.set()

    def session():
        if gated.is_set():
            gate.wait()  # both runtimes have read the checkpoint and cut their ranges
        return spark

    stores = [Store(s.db_url) for _ in range(2)]
    runtimes = [SupervisorRuntime("race", RuntimeContext(store=st, segments_dir=s.segments_dir, spark=session))
                for st in stores]
    store.init_checkpoints("race", dict.fromkeys(map(str, ends), 0))
    outcomes: list = [None, None]

    def step(i: int) -> None:
        outcomes[i] = runtimes[i].step()

    with h.TableWatcher(s, "race") as watcher:
        threads = [threading.Thread(target=step, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    gated.clear()

    assert sorted(o.records for o in outcomes) == [0, len(records)], outcomes
    assert all(rt.failures == 0 for rt in runtimes), [list(rt.recent_errors) for rt in runtimes]
    [won] = h.batches(s)
    assert watcher.seen == {won["batch_id"]}
    watcher.check()
    assert h.staging_leftovers(s) == []

    # produce more and let the two runtimes take turns: still every key once
    more = devservices.make_records(3_000, start=len(records))
    ends = devservices.produce_kafka(kafka_broker.bootstrap, spec.source.topic, more)
    for _ in range(10):
        for rt in runtimes:
            rt.step()
        if store.checkpoints("race") == {str(p): e for p, e in ends.items()}:
            break
    assert store.checkpoints("race") == {str(p): e for p, e in ends.items()}
    h.assert_exactly_once(h.key_counts(spark, s, "race"), h.keys(records + more))
    assert h.staging_leftovers(s) == []
    for rt in runtimes:
        rt.close()
    for st in (*stores, store):
        st.close()
