"""The fingerprint on HEALTHY sources, and the first step (review of 4b3bdf9, issue 41.11)
after the upgrade. Concrete schedules against the real store (SQLite) and the real
``SupervisorRuntime``, with the stand-in broker and batch of
tests/runtime/test_recreation_exactly_once.py, extended with the answers the real adapters
give:

* Kafka (``kafka.identity.record_at``): a consumer assigned at an offset below the log start
  gets OFFSET_OUT_OF_RANGE (``auto.offset.reset`` is forced to ``error``), which record_at
  takes as "the partition no longer holds it": None.
* RabbitMQ (``RabbitStreamAdapter.record_times`` via ``first_chunk``): a subscription at an
  offset below the stream's first chunk is served from the first chunk (the reader's own
  ``_check_gap`` relies on that), so the timestamp answered is the first retained chunk's,
  and ``fingerprint.ask`` pairs it with the offset ASKED.

The schedule of the first two tests: the fingerprinted record (a mark never moves while its
record is held, so every mark is eventually reached by retention) is deleted by retention
after the check read the earliest offsets and before it fetched the record. Kafka deletes a
whole segment at once (log start jumps), RabbitMQ too; the check runs every 60 s, so every
mark meets retention once, and with it this window.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reconciler.model import PartitionRange
from reconciler.store.store import Store
from tests.runtime.test_recreation_exactly_once import (
    Broker,
    Ledger,
    Topic,
    make_spec,
    runtime,
    steps,
)


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    yield s
    s.close()


class KafkaLike(Broker):
    """``records_at`` as ``kafka.identity.record_at`` answers it; ``before_fetch``: something
    that happens on the broker after the step read the earliest offsets and before the fetch."""

    before_fetch = None

    def records_at(self, offsets):
        if self.before_fetch:
            hook, self.before_fetch = self.before_fetch, None
            hook()
        # below the log start: OFFSET_OUT_OF_RANGE -> ended -> None; past the end: EOF -> None
        return {p: (o, self.topic.born + o) if self.holds(p, o) else None for p, o in offsets.items()}


class RabbitLike(Broker):
    """No ids; ``record_times`` as a subscription at the offset answers: the chunk holding it,
    the first retained chunk when retention deleted it (one record per chunk here), None at the end."""

    before_fetch = None

    def identity(self):
        return None

    def record_times(self, offsets):
        if self.before_fetch:
            hook, self.before_fetch = self.before_fetch, None
            hook()
        out = {}
        for p, o in offsets.items():
            first, end = self.topic.earliest.get(p, 0), self.topic.ends.get(p, 0)
            out[p] = self.topic.born + max(o, first) if max(o, first) < end else None
        return out


def _healthy(store, tmp_path, broker, **spec):
    """Ingested [0, 15), fingerprinted, then [15, 100) ingested with the mark left where it was."""
    ledger = Ledger()
    store.create_supervisor(make_spec(**spec), None, actor="t")
    store.init_checkpoints("clicks", {"0": 0})
    rt = runtime(store, broker, ledger, tmp_path)
    steps(rt, 3)
    marks = store.source_fingerprint("clicks", 0)
    assert marks == {"0": (14, broker.topic.born + 14)}, marks
    broker.topic.ends = {"0": 100}
    steps(rt, 2)
    assert store.checkpoints("clicks") == {"0": 100} and store.source_fingerprint("clicks", 0) == marks
    return rt, ledger


def _retention_during_the_check(broker, rt):
    def delete_first_segment():  # retention deletes the segment [0, 50): already ingested, healthy
        broker.topic.earliest = {"0": 50}

    broker.before_fetch = delete_first_segment
    rt._source_guard()._checked -= 60  # noqa: SLF001 - a minute later: the fingerprint is asked again


def _assert_nothing_happened(store, ledger, tid):
    rec = store.get("clicks")
    twice = ledger.twice(tid)
    assert (store.source_restarts(), rec.state.name.startswith("UNHEALTHY"), twice, store.lost_records("clicks")) \
        == ({}, False, [], 0), (
        f"a healthy partition whose fingerprinted record retention deleted was read as re-created: restarts "
        f"{store.source_restarts()}, state {rec.state.name} ({rec.runtime_error}), checkpoints "
        f"{store.checkpoints('clicks')}, {len(twice)} records ingested twice, "
        f"{store.lost_records('clicks')} records reported lost")


def test_kafka_mark_deleted_by_retention_during_the_check_is_not_a_recreation(store, tmp_path):
    """Kafka WITH topic ids (the id never changes): the fingerprint alone rewinds the healthy
    partition to the stale earliest offset 0 in a new generation; the read of [0, 50) then fails,
    the retention rule records [0, 50) as LOST (it was ingested), and [50, 100) is ingested again."""
    broker = KafkaLike(Topic("A", {"0": 15}))
    rt, ledger = _healthy(store, tmp_path, broker, onRetentionLoss="continue")
    _retention_during_the_check(broker, rt)
    steps(rt, 6)
    _assert_nothing_happened(store, ledger, "A")


def test_kafka_mark_deleted_by_retention_during_the_check_default_policy_stays_healthy(store, tmp_path):
    """Default policy: UNHEALTHY_SUPERVISOR for that step (MAX_BACKOFF), advising
    `reconciler reset clicks --to '{"0": 0}' --allow-rewind`: followed, every retained record is
    ingested again. (The next check finds the mark deleted, takes another, and the state clears.)"""
    broker = KafkaLike(Topic("A", {"0": 15}))
    rt, ledger = _healthy(store, tmp_path, broker)
    _retention_during_the_check(broker, rt)
    steps(rt, 1)
    _assert_nothing_happened(store, ledger, "A")


def test_rabbitmq_mark_deleted_by_retention_during_the_check_is_not_a_recreation(store, tmp_path):
    """RabbitMQ: the subscription at the deleted offset is served from the first retained chunk;
    its timestamp, paired with the offset asked, reads as "another timestamp at an offset
    already read"."""
    broker = RabbitLike(Topic(None, {"0": 15}))
    rt, ledger = _healthy(store, tmp_path, broker, onRetentionLoss="continue")
    _retention_during_the_check(broker, rt)
    steps(rt, 6)
    _assert_nothing_happened(store, ledger, None)


# ---------------------------------------------------------------------------------------------
# Loss side: the first step after the upgrade on a topic re-created meanwhile. A Kafka topic is
# re-created as a whole; ``written_after`` proves it on partition 0 (its checkpoint was set by a
# batch), but partition 1, whose checkpoint was set by the start (``startFrom: latest``: its 15
# records predate the supervisor, none came since), has no batch to compare with and keeps its
# old checkpoint in the new generation, whose recorded id is now the new topic's: [0, 15) of the
# new topic's partition 1 is never read and nothing records it.


def test_first_step_after_the_upgrade_restarts_every_partition_of_the_recreated_topic(store, tmp_path):
    store.create_supervisor(make_spec(onRetentionLoss="continue"), None, actor="t")
    store.init_checkpoints("clicks", {"0": 0, "1": 15})  # partition 1: startFrom latest, no record since
    store.publish(supervisor_id="clicks", epoch=store.get("clicks").epoch, batch_id="before-the-upgrade",
                  datasource="clicks", ranges=[PartitionRange("0", 0, 15)], files=(), records=15, unparseable=0,
                  now=datetime.now(UTC) - timedelta(hours=1))
    broker, ledger = KafkaLike(Topic("B", {"0": 20, "1": 20})), Ledger()  # re-created since, 20 records each
    rt = runtime(store, broker, ledger, tmp_path)
    steps(rt, 4)
    assert store.source_restarts() == {"clicks": 1}  # the re-creation WAS found (partition 0)
    missing = sorted(set((p, o) for p in ("0", "1") for o in range(20)) - set(ledger.of("B")))
    rec = store.get("clicks")
    assert missing == [] or rec.state.name.startswith("UNHEALTHY") or store.lost_records("clicks"), (
        f"records of the re-created topic skipped silently: {missing}; checkpoints {store.checkpoints('clicks')}, "
        f"restart: {[e['reason'] for e in store.history('clicks') if e['action'] == 'source-restarted']}")


def test_first_step_after_the_upgrade_default_policy_advises_every_partition(store, tmp_path):
    """Default policy: the UNHEALTHY advice rewinds every partition of the re-created topic, not
    only the one proven (followed, nothing of partition 1's new records is skipped)."""
    store.create_supervisor(make_spec(), None, actor="t")
    store.init_checkpoints("clicks", {"0": 0, "1": 15})
    store.publish(supervisor_id="clicks", epoch=store.get("clicks").epoch, batch_id="before-the-upgrade",
                  datasource="clicks", ranges=[PartitionRange("0", 0, 15)], files=(), records=15, unparseable=0,
                  now=datetime.now(UTC) - timedelta(hours=1))
    rt = runtime(store, KafkaLike(Topic("B", {"0": 20, "1": 20})), Ledger(), tmp_path)
    steps(rt, 2)
    rec = store.get("clicks")
    assert rec.state.name == "UNHEALTHY_SUPERVISOR", rec.state
    assert """--to '{"0": 0, "1": 0}' --allow-rewind""" in rec.runtime_error, rec.runtime_error
    assert store.checkpoints("clicks") == {"0": 15, "1": 15}  # nothing moved, nothing read, until chosen


class RabbitStreams(Broker):
    """Two RabbitMQ streams (each its own source, no ids) with the real adapter's records_at:
    the record from the chunk that holds the offset, None when none holds it."""

    independent_partitions = True

    def identity(self):
        return None

    def records_at(self, offsets):
        return {p: (o, self.topic.born + o) if self.holds(p, o) else None for p, o in offsets.items()}


def test_rabbitmq_stream_redeclared_moves_only_that_stream(store, tmp_path):
    """Stream "0" deleted and declared again with more records than the checkpoint; stream "1"
    untouched: only "0" goes back to 0 (each stream is its own source)."""
    broker, ledger = RabbitStreams(Topic(None, {"0": 15, "1": 15})), Ledger()
    store.create_supervisor(make_spec(onRetentionLoss="continue"), None, actor="t")
    store.init_checkpoints("clicks", {"0": 0, "1": 0})
    rt = runtime(store, broker, ledger, tmp_path)
    steps(rt, 3)
    assert store.checkpoints("clicks") == {"0": 15, "1": 15}
    old = broker.topic.born
    broker.topic = Topic(None, {"0": 20, "1": 15})
    broker.topic.born = old  # stream "1" keeps its records and their times ...
    original = broker.records_at
    broker.records_at = lambda offsets: {p: (m[0], m[1] + (7 if p == "0" else 0)) if m else m  # ... "0" does not
                                         for p, m in original(offsets).items()}
    rt._source_guard()._checked -= 60  # noqa: SLF001 - a minute later: the fingerprint is asked again
    steps(rt, 3)
    moved = [e["reason"] for e in store.history("clicks") if e["action"] == "source-restarted"]
    assert len(moved) == 1 and "0: 15 -> 0" in moved[0] and "1: 15" not in moved[0], moved
    assert store.checkpoints("clicks") == {"0": 20, "1": 15}


def test_rabbitmq_records_at_takes_only_the_chunk_holding_the_offset():
    """A subscription at a deleted offset is served from the first chunk still kept: its
    timestamp is not the asked record's (None: not held); the chunk holding it answers."""
    from rstream import schema

    from reconciler.streams.rabbitmq.adapter import held_time

    def chunk(first, n, ts):
        return schema.Deliver(subscription_id=1, magic_version=0, chunk_type=0, num_entries=n, num_records=n,
                              timestamp=ts, epoch=1, chunk_first_offset=first, chunk_crc=0, data_length=0,
                              trailer_length=0, _reserved=0, data=b"")

    assert held_time(chunk(10, 5, 777), 12) == (12, 777)
    assert held_time(chunk(10, 5, 777), 10) == (10, 777)
    assert held_time(chunk(50, 5, 999), 14) is None  # retention deleted 14: the first chunk kept answered
    assert held_time(chunk(10, 5, 777), 15) is None  # not in that chunk either
    assert held_time(None, 14) is None  # the end
