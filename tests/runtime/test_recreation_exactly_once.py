"""A topic re-created below the checkpoint (issue 41.11), exactly once: concrete schedules.

Each test is a concrete schedule against the real store (SQLite) and the real
``SupervisorRuntime``; the broker is a stand-in that models the records themselves (which
topic incarnation, which partition, which offset, and each record's timestamp), and the
batch is a stand-in that reads those records, asks the runtime to confirm the source as the
real batch does between its read and its publish, and publishes with the real
``Store.publish`` (the epoch and checkpoint CAS).
The property checked is the change's own requirement: every record of the re-created
topic lands exactly once (never twice, never skipped silently).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from reconciler.control.requests import from_cli
from reconciler.control.resets import Positions, compute_reset
from reconciler.errors import RetryableError
from reconciler.model import PartitionRange, Position, SupervisorSpec
from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime
from reconciler.store.store import Store

_BORN = itertools.count()


class Topic:
    """One incarnation of the topic: its id, per partition [earliest, end), and when it was
    created (record ``o`` has timestamp ``born + o`` ms): another incarnation, other timestamps."""

    def __init__(self, tid, ends, earliest=None, born=None):
        self.id, self.ends = tid, dict(ends)
        self.earliest = dict(earliest or {p: 0 for p in ends})
        self.born = born if born is not None else int(time.time() * 1000) + 1000 * next(_BORN)


class Broker:
    """The stand-in broker. ``id_unavailable``: how many coming ``identity()`` calls get no
    answer (DescribeTopics timing out under load, or not yet knowing a just-created topic),
    which ``kafka.identity.topic_id`` turns into None. ``on_identity``: called after an
    ``identity()`` answer (a re-creation in the same step, after the check)."""

    def __init__(self, topic: Topic):
        self.topic = topic
        self.id_unavailable = 0
        self.on_identity = None

    def partitions(self):
        return sorted(self.topic.ends)

    def earliest(self):
        return dict(self.topic.earliest)

    def latest(self):
        return dict(self.topic.ends)

    def identity(self):
        if self.id_unavailable:
            self.id_unavailable -= 1
            return None
        tid = self.topic.id
        if self.on_identity:
            hook, self.on_identity = self.on_identity, None
            hook()
        return tid

    def holds(self, partition, offset):
        return self.topic.earliest.get(partition, 0) <= offset < self.topic.ends.get(partition, 0)

    def record_times(self, offsets):
        return {p: self.topic.born + o if self.holds(p, o) else None for p, o in offsets.items()}

    def close(self):
        pass


def make_spec(sid="clicks", **over) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "clicks"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}, **over})


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    yield s
    s.close()


class Ledger:
    """What landed in the table: (topic id, partition, offset) per record, with its generation."""

    def __init__(self):
        self.rows: list[tuple[str, str, int, int]] = []

    def of(self, tid):
        return Counter((p, o) for t, p, o, _ in self.rows if t == tid)

    def twice(self, tid):
        return sorted(k for k, n in self.of(tid).items() if n > 1)


def runtime(store, broker, ledger, tmp_path, sid="clicks"):
    rt = SupervisorRuntime(sid, RuntimeContext(store=store, segments_dir=tmp_path, spark=lambda: None))
    rt._adapter_for = lambda rec: broker  # noqa: SLF001 - the stand-in broker

    def run_batch(rec, spec, ranges, **_):
        """Read the records the broker holds now, then publish (the real CAS)."""
        rows = []
        for r in ranges:
            if not broker.topic.earliest.get(r.partition, 0) <= r.start <= r.end <= broker.topic.ends.get(r.partition, 0):
                raise RetryableError(f"{r.partition}: [{r.start}, {r.end}) not readable")
            rows += [(broker.topic.id, r.partition, o, rec.generation) for o in range(r.start, r.end)]
        rt._confirm_source(rec)  # noqa: SLF001 - as the real batch, between its read and its publish
        store.publish(supervisor_id=rec.id, epoch=rec.epoch, batch_id=f"b{len(ledger.rows)}-{rec.id}",
                      datasource="clicks", ranges=ranges, files=(), records=len(rows), unparseable=0)
        ledger.rows += rows
        return len(rows)

    rt._run_batch = run_batch  # noqa: SLF001
    return rt


def steps(rt, n):
    for _ in range(n):
        rt.step()


def ingested_a(store, tmp_path, ends, tid="A", **spec):
    """A supervisor that ingested all of topic A (``ends``), its id (``tid``) recorded."""
    broker, ledger = Broker(Topic(tid, ends)), Ledger()
    store.create_supervisor(make_spec(**spec), None, actor="t")
    store.init_checkpoints("clicks", {p: 0 for p in ends})
    rt = runtime(store, broker, ledger, tmp_path)
    steps(rt, 3)
    assert store.checkpoints("clicks") == ends
    assert sorted(ledger.of(tid)) == sorted((p, o) for p, e in ends.items() for o in range(e))
    return broker, ledger, rt


# ---------------------------------------------------------------------------------------------
# 1. One unanswered DescribeTopics right after the re-creation: the new topic's records above
#    the old checkpoint are ingested in the OLD generation, then the id is seen, the checkpoint
#    goes back to 0, and they are ingested again (a different generation: verify keeps the
#    generations apart and sees no duplicate offset).


def test_identity_unavailable_once_after_recreation_does_not_duplicate(store, tmp_path):
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15}, onRetentionLoss="continue")
    broker.topic = Topic("B", {"0": 20})  # deleted and created again, 20 new records
    broker.id_unavailable = 1  # DescribeTopics times out once (topic_id() -> None)
    steps(rt, 4)
    assert store.source_restarts() == {"clicks": 1}  # the re-creation was found (one step late)
    assert sorted(ledger.of("B")) == [("0", o) for o in range(20)]  # every new record landed...
    assert ledger.twice("B") == [], f"records of the re-created topic ingested twice: {ledger.twice('B')}"


def test_identity_unavailable_once_after_recreation_reads_nothing_of_the_new_topic_in_the_old_generation(
        store, tmp_path):
    """Default policy: the step with no id answer publishes [15, 20) of the new topic as the old
    source (generation 0), skipping [0, 15); the UNHEALTHY that follows names a rewind to 0,
    which ingests [15, 20) a second time."""
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15})
    broker.topic = Topic("B", {"0": 20})
    broker.id_unavailable = 1
    steps(rt, 2)
    read_as_old = [(p, o) for t, p, o, g in ledger.rows if t == "B" and g == 0]
    assert read_as_old == [], f"new topic's records published in the old source generation: {read_as_old}"


# ---------------------------------------------------------------------------------------------
# 2. A restart found by the probe while the id is unanswered records the OLD id as the new
#    generation's (``self._identity = (generation, found.identity or known)``): once the id is
#    answered again the same re-creation is "found" a second time and the records read since
#    are read again.


def test_restart_found_without_an_id_does_not_keep_the_old_id_for_the_new_generation(store, tmp_path):
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15}, onRetentionLoss="continue")
    broker.topic = Topic("B", {"0": 5})  # re-created with fewer records: the probe finds it
    broker.id_unavailable = 2
    steps(rt, 5)
    assert ledger.twice("B") == [], (f"records of the re-created topic ingested twice: {ledger.twice('B')}; "
                                     f"restarts: {store.source_restarts()}")


# ---------------------------------------------------------------------------------------------
# 3. The window the commit admits: the topic re-created after the id was checked and before
#    the batch read, in the same step. Checking the id again after the read (before publish)
#    closes it; as it stands the records read land twice.


def test_recreated_between_the_identity_check_and_the_read_does_not_duplicate(store, tmp_path):
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15}, onRetentionLoss="continue")
    broker.topic.ends = {"0": 18}  # 3 more records of A, not read yet

    def recreate():
        broker.topic = Topic("B", {"0": 20})

    broker.on_identity = recreate  # latest() said 18 of A; the read finds B
    steps(rt, 4)
    assert ledger.twice("B") == [], f"records of the re-created topic ingested twice: {ledger.twice('B')}"


# ---------------------------------------------------------------------------------------------
# 4. A backfill running across the re-creation is not checked: it reads its bounded range
#    from the new topic while the main supervisor, having found the new id, reads the new
#    topic from 0.


def test_backfill_across_recreation_does_not_duplicate(store, tmp_path):
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15}, onRetentionLoss="continue")
    broker.topic.ends = {"0": 18}
    pos = Positions(earliest={"0": 0}, latest={"0": 18})
    to = Position("latest")
    res = store.apply_reset(from_cli("clicks", to, operation_id="lag"),
                            lambda cp: compute_reset(to, cp, pos, backfill=True),
                            initial={}, earliest=pos.earliest, actor="t")
    assert res.backfill_id and store.checkpoints(res.backfill_id) == {"0": 15}
    rt.reconsider()

    broker.topic = Topic("B", {"0": 20})  # re-created before the backfill ran
    steps(rt, 3)  # main: new id found, back to 0, [0, 20) of B
    assert store.source_restarts() == {"clicks": 1}
    bf = runtime(store, broker, ledger, tmp_path, sid=res.backfill_id)
    steps(bf, 3)  # backfill: [15, 18) of ... B
    assert ledger.twice("B") == [], f"records of the re-created topic ingested twice: {ledger.twice('B')}"


# ---------------------------------------------------------------------------------------------
# 5. Re-created with fewer partitions: the vanished partition keeps its old checkpoint (15),
#    and when the partition is added again it is read from 15, not from its earliest offset:
#    [0, 15) of the new partition is skipped, with nothing recorded.


def test_partition_gone_at_recreation_and_added_again_is_read_from_its_earliest(store, tmp_path):
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15, "1": 15}, onRetentionLoss="continue")
    broker.topic = Topic("B", {"0": 20})  # re-created with one partition
    steps(rt, 3)
    assert store.source_restarts() == {"clicks": 1}
    broker.topic.ends["1"], broker.topic.earliest["1"] = 20, 0  # partition 1 added, 20 records
    steps(rt, 3)
    missing = sorted(set(("1", o) for o in range(20)) - set(ledger.of("B")))
    assert missing == [], (f"records of the re-created topic's partition 1 never ingested: {missing}; "
                           f"checkpoints {store.checkpoints('clicks')}, restarts {store.source_restarts()}")


# ---------------------------------------------------------------------------------------------
# 6. No id to compare (a RabbitMQ stream, whose adapter's identity() is always None; a Kafka
#    broker without topic ids; or the first step after the upgrade, no id recorded yet) and the
#    new source already holds more records than the checkpoint: no partition ends below its
#    checkpoint, so nothing is probed, and [0, checkpoint) of the new source is skipped with
#    nothing recorded. (The record time of the offset below the checkpoint, already readable
#    through record_times, would tell the two sources apart.)


def test_redeclared_source_without_an_id_and_more_records_than_the_checkpoint_is_not_skipped(store, tmp_path):
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15}, tid=None, onRetentionLoss="continue")
    broker.topic = Topic(None, {"0": 20})  # deleted and declared again; no id to compare
    rt._source_guard()._checked -= 60  # noqa: SLF001 - a minute later: the fingerprint is asked again
    steps(rt, 3)
    missing = sorted(set(("0", o) for o in range(20)) - set(ledger.of(None)))
    assert missing == [] or store.source_restarts() or store.get("clicks").state.name.startswith("UNHEALTHY"), (
        f"new records below the old checkpoint skipped silently: {missing}")
    assert store.source_restarts() == {"clicks": 1} and missing == []  # found by the fingerprint


def test_first_step_after_the_upgrade_on_a_topic_already_recreated_is_not_skipped(store, tmp_path):
    """Checkpoints from before the upgrade (no ``source-identity`` in the audit log); the topic
    was re-created meanwhile with more records than the checkpoint."""
    store.create_supervisor(make_spec(onRetentionLoss="continue"), None, actor="t")
    store.init_checkpoints("clicks", {"0": 0})
    # ingested [0, 15) of the old topic an hour before the upgrade; the topic re-created since
    store.publish(supervisor_id="clicks", epoch=store.get("clicks").epoch, batch_id="before-the-upgrade",
                  datasource="clicks", ranges=[PartitionRange("0", 0, 15)], files=(), records=15, unparseable=0,
                  now=datetime.now(UTC) - timedelta(hours=1))
    broker, ledger = Broker(Topic("B", {"0": 20})), Ledger()
    rt = runtime(store, broker, ledger, tmp_path)
    steps(rt, 3)
    missing = sorted(set(("0", o) for o in range(20)) - set(ledger.of("B")))
    assert missing == [] or store.source_restarts() or store.get("clicks").state.name.startswith("UNHEALTHY"), (
        f"new records below the old checkpoint skipped silently: {missing}")
    # found by the record's timestamp (written after the batch that ingested its offset), not by a failure
    assert store.source_restarts() == {"clicks": 1} and missing == [] and ledger.twice("B") == []


# ---------------------------------------------------------------------------------------------
# The backfill's way out, and the fingerprint's cost in the audit log.


def _backfill_to_latest(store, broker, rt):
    broker.topic.ends = {"0": 18}
    pos = Positions(earliest={"0": 0}, latest={"0": 18})
    to = Position("latest")
    res = store.apply_reset(from_cli("clicks", to, operation_id="lag"),
                            lambda cp: compute_reset(to, cp, pos, backfill=True),
                            initial={}, earliest=pos.earliest, actor="t")
    rt.reconsider()
    return res.backfill_id


def test_backfill_of_a_recreated_topic_ends_with_its_range_recorded_as_lost(store, tmp_path):
    """Found by the backfill itself (the id), before the main supervisor stepped again."""
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15}, onRetentionLoss="continue")
    bf_id = _backfill_to_latest(store, broker, rt)
    broker.topic = Topic("B", {"0": 20})
    bf = runtime(store, broker, ledger, tmp_path, sid=bf_id)
    steps(bf, 3)
    assert ledger.of("B") == Counter()
    assert store.get(bf_id).state.name == "COMPLETED"
    [entry] = [e for e in store.history(bf_id) if e["action"] == "retention-loss"]
    assert entry["details"]["lostRanges"] == {"0": [15, 18]} and "deleted and created again" in entry["reason"]
    assert store.lost_records(bf_id) == 3


def test_backfill_of_a_recreated_topic_is_unhealthy_by_default(store, tmp_path):
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15})
    bf_id = _backfill_to_latest(store, broker, rt)
    broker.topic = Topic("B", {"0": 20})
    bf = runtime(store, broker, ledger, tmp_path, sid=bf_id)
    steps(bf, 2)
    rec = store.get(bf_id)
    assert ledger.of("B") == Counter()
    assert rec.state.name == "UNHEALTHY_SUPERVISOR" and f"reconciler backfill cancel {bf_id}" in rec.runtime_error
    assert store.checkpoints(bf_id) == {"0": 15}


def test_fingerprint_is_written_once_per_generation_not_every_check(store, tmp_path):
    broker, ledger, rt = ingested_a(store, tmp_path, {"0": 15}, tid=None)
    for more in range(16, 26):
        broker.topic.ends = {"0": more}
        rt._source_guard()._checked -= 60  # noqa: SLF001 - a minute later: asked again
        steps(rt, 1)
    assert store.checkpoints("clicks") == {"0": 25} and ledger.twice(None) == []
    assert len([e for e in store.history("clicks") if e["action"] == "source-fingerprint"]) == 1
    assert store.source_restarts() == {}
