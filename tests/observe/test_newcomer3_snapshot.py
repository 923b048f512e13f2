"""Issue 46, the third newcomer run, item 1: ``status`` said ``RUNNING lag 100000, records 500000``
while the topic held 500,000. The checkpoints were read, the brokers asked, and only then the batch
totals: a publish in between moved the records but not the checkpoints shown. Both now come from
one snapshot of the database. Deterministic: a batch is committed between the two reads. On SQLite
and on PostgreSQL (whose READ COMMITTED gives each statement a snapshot of its own)."""

from __future__ import annotations

import pytest

from reconciler.control.actual import State
from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.observe import status as status_mod
from reconciler.observe.status import all_status
from reconciler.store.store import Store


@pytest.fixture
def store(db_url):
    s = Store(db_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()


def _create(store, sid: str) -> None:
    doc = {"id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": sid},
           "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}}
    store.create_supervisor(SupervisorSpec.from_document(doc), None, actor="test")
    store.set_state(sid, State.RUNNING)
    store.init_checkpoints(sid, {"0": 0})
    store.publish(supervisor_id=sid, epoch=1, batch_id=f"{sid}-b1", datasource=sid,
                  ranges=[PartitionRange("0", 0, 100_000)], files=[], records=100_000, unparseable=0)


class _Topic:
    """The topic's end, as the broker would answer: 500,000 records."""

    def latest(self):
        return {"0": 500_000}

    def record_times(self, offsets):
        return {p: None for p in offsets}

    def close(self):
        pass


def _commit_before(store, monkeypatch, method: str, sid: str) -> None:
    """The first call of ``store.<method>`` commits the next batch just before it reads."""
    original = getattr(store, method)
    calls = []

    def racing(*args, **kwargs):
        if not calls:
            calls.append(1)
            store.publish(supervisor_id=sid, epoch=1, batch_id=f"{sid}-b2", datasource=sid,
                          ranges=[PartitionRange("0", 100_000, 500_000)], files=[], records=400_000,
                          unparseable=0)
        return original(*args, **kwargs)

    monkeypatch.setattr(store, method, racing)


@pytest.mark.parametrize("one, method", [
    pytest.param(None, "all_batch_totals", id="status"),
    pytest.param("clicks", "batch_totals", id="status ID"),
])
def test_lag_and_records_are_from_the_same_moment(store, monkeypatch, one, method):
    _create(store, "clicks")
    monkeypatch.setattr(status_mod, "adapter_for", lambda source, timeout: _Topic())
    _commit_before(store, monkeypatch, method, "clicks")
    [item] = all_status(store, one, live=True)
    assert item["partitions"][0]["checkpoint"] == 100_000
    # before the batch: 100,000 ingested, 400,000 behind (not 500,000 ingested and 400,000 behind)
    assert (item["records"], item["lag"], item["batches"]) == (100_000, 400_000, 1)
    assert item["records"] + item["lag"] == 500_000
    # the batch was committed: the next look sees it whole
    [after] = all_status(store, one, live=True)
    assert (after["records"], after["lag"], after["batches"]) == (500_000, 0, 2)


def test_a_snapshot_inside_a_snapshot_is_the_same_one(store):
    _create(store, "clicks")
    with store.snapshot():
        before = store.batch_totals("clicks").records
        with store.snapshot():
            store.publish(supervisor_id="clicks", epoch=1, batch_id="clicks-b2", datasource="clicks",
                          ranges=[PartitionRange("0", 100_000, 100_010)], files=[], records=10, unparseable=0)
            assert store.batch_totals("clicks").records == before == 100_000
        assert store.read_actual().checkpoints["clicks"] == {"0": 100_000}
    assert store.batch_totals("clicks").records == 100_010


def test_a_chart_sample_pairs_the_lag_with_the_records_of_its_moment(store, monkeypatch):
    """The lag observer read the totals after asking the brokers, as ``status`` did."""
    from reconciler.observe import lagwatch
    from reconciler.observe.lagwatch import LagObserver

    _create(store, "clicks")
    monkeypatch.setattr(lagwatch, "adapter_for", lambda source, timeout: _Topic())
    _commit_before(store, monkeypatch, "all_batch_totals", "clicks")
    observer = LagObserver(store, interval=5.0)
    observer.observe_once()
    sample = observer.history("clicks")[-1]
    assert (sample.records, sample.ingested) == (400_000, 100_000)
    observer.observe_once()
    sample = observer.history("clicks")[-1]
    assert (sample.records, sample.ingested) == (0, 500_000)
