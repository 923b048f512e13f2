"""A source that started over below the checkpoint (issue 41 item 11): never IDLE, never skipped.

The runtime's rule, like retention loss: a main supervisor turns UNHEALTHY with what happened
and the way out (default), or goes back to the new earliest offsets in a new source
generation, recorded (``onRetentionLoss: continue``). Database: a real SQLite file. The broker
is a stand-in answering positions, the topic id and whether an offset is still held (the real
broker's answers are checked in tests/streams/test_kafka_identity.py and end to end in
tests/e2e/test_recreated_topic.py); the batch is recorded, not run.
"""

from __future__ import annotations

import pytest

from reconciler.control.actual import State
from reconciler.control.requests import from_cli
from reconciler.control.resets import Positions, compute_reset
from reconciler.model import Position, SupervisorSpec
from reconciler.runtime import truncation
from reconciler.runtime.supervisor import MAX_BACKOFF, RuntimeContext, SupervisorRuntime
from reconciler.store.store import Store


class Broker:
    def __init__(self, earliest, latest, *, topic_id=None, held=None):
        self.earliest_, self.latest_, self.topic_id, self.held = earliest, latest, topic_id, held or {}
        self.probed: list[tuple[str, int]] = []

    def earliest(self):
        return dict(self.earliest_)

    def latest(self):
        return dict(self.latest_)

    def identity(self):
        return self.topic_id

    def holds(self, partition, offset):
        self.probed.append((partition, offset))
        return self.held.get(partition, True)

    def close(self):
        pass


def make_spec(**over) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "clicks"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}, **over})


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    yield s
    s.close()


def runtime(store, broker, tmp_path):
    ran: list = []
    rt = SupervisorRuntime("clicks", RuntimeContext(store=store, segments_dir=tmp_path, spark=lambda: None))
    rt._adapter_for = lambda rec: broker  # noqa: SLF001 - the stand-in broker
    rt._run_batch = lambda rec, spec, ranges, **_: ran.append([(r.partition, r.start, r.end) for r in ranges]) or 0
    return rt, ran


def started(store, spec, broker, tmp_path, checkpoints):
    """A supervisor that ingested up to ``checkpoints`` of the topic with id ``A``."""
    store.create_supervisor(spec, None, actor="t")
    store.init_checkpoints("clicks", checkpoints)
    rt, ran = runtime(store, broker, tmp_path)
    broker.topic_id = "A"
    rt.step()  # the identity is recorded the first time it is seen
    assert [e["details"]["identity"] for e in store.history("clicks") if e["action"] == "source-identity"] == ["A"]
    ran.clear()
    return rt, ran


def test_recreated_topic_with_more_records_than_the_checkpoint_is_unhealthy_not_half_read(store, tmp_path):
    """The hostile round's case: checkpoint 15, the topic re-created with 20 records per partition."""
    broker = Broker({"0": 0, "1": 0}, {"0": 15, "1": 15})
    rt, ran = started(store, make_spec(), broker, tmp_path, {"0": 15, "1": 15})
    broker.topic_id, broker.latest_ = "B", {"0": 20, "1": 20}
    out = rt.step()
    rec = store.get("clicks")
    assert ran == [] and out.delay == MAX_BACKOFF
    assert rec.state == State.UNHEALTHY_SUPERVISOR
    assert "deleted and created again (its id was A, it is now B)" in rec.runtime_error
    assert """reconciler reset clicks --to '{"0": 0, "1": 0}' --allow-rewind""" in rec.runtime_error
    assert "onRetentionLoss: continue" in rec.runtime_error
    assert store.checkpoints("clicks") == {"0": 15, "1": 15}  # nothing skipped

    # the way out it names: the rewind, then a new source generation, then the new records
    pos = Positions(earliest={"0": 0, "1": 0}, latest={"0": 20, "1": 20})
    to = Position("offsets", offsets={"0": 0, "1": 0})
    store.apply_reset(from_cli("clicks", to, operation_id="out", allow_rewind=True),
                      lambda cp: compute_reset(to, cp, pos, backfill=True, allow_rewind=True),
                      initial={}, earliest=pos.earliest, actor="t")
    rt.reconsider()
    rt.step()  # the new identity is accepted: nothing is above the new earliest any more
    assert store.get("clicks").generation == 1
    rt.step()
    assert ran == [[("0", 0, 20), ("1", 0, 20)]]


def test_recreated_topic_with_continue_reads_every_new_record_in_a_new_generation(store, tmp_path):
    broker = Broker({"0": 0, "1": 0}, {"0": 15, "1": 15})
    rt, ran = started(store, make_spec(onRetentionLoss="continue"), broker, tmp_path, {"0": 15, "1": 15})
    broker.topic_id, broker.latest_ = "B", {"0": 20, "1": 20}
    rt.step()
    assert store.checkpoints("clicks") == {"0": 0, "1": 0}
    assert store.get("clicks").generation == 1
    [entry] = [e for e in store.history("clicks") if e["action"] == "source-restarted"]
    assert entry["details"] == {"generation": 1, "identity": "B", "previousIdentity": "A",
                                "restartedPartitions": {"0": {"checkpoint": 15, "new": 0},
                                                        "1": {"checkpoint": 15, "new": 0}}}
    assert "deleted and created again" in entry["reason"]
    assert store.source_restarts() == {"clicks": 1}
    rt.step()
    assert ran == [[("0", 0, 20), ("1", 0, 20)]]
    rt.step()  # the new identity is the known one now: no second restart
    assert store.source_restarts() == {"clicks": 1}


def test_partition_truncated_below_the_checkpoint_is_not_idle(store, tmp_path):
    """Same topic id (an unclean leader election, or a broker without ids): the end fell below
    the checkpoint and the last record ingested is gone."""
    broker = Broker({"0": 0, "1": 0}, {"0": 15, "1": 15})
    rt, ran = started(store, make_spec(onRetentionLoss="continue"), broker, tmp_path, {"0": 15, "1": 15})
    broker.latest_, broker.held = {"0": 8, "1": 15}, {"0": False}
    rt.step()
    assert broker.probed == [("0", 14)]
    assert store.checkpoints("clicks") == {"0": 0, "1": 15}
    rt.step()
    assert ran == [[("0", 0, 8)]]


def test_an_under_reported_end_with_the_record_still_there_is_not_truncation(store, tmp_path):
    """Tansu reports the last batch's base offset + 1: a checkpoint above it, record still held."""
    broker = Broker({"0": 0}, {"0": 1}, held={"0": True})
    rt, ran = started(store, make_spec(onRetentionLoss="continue"), broker, tmp_path, {"0": 15})
    rt.step()
    assert broker.probed[-1] == ("0", 14)
    assert store.get("clicks").state == State.IDLE
    assert store.checkpoints("clicks") == {"0": 15} and store.source_restarts() == {}


def test_only_a_changed_identity_is_proof():
    """No identity recorded yet, or none given now: not proof (the probe decides then)."""
    assert truncation.decide({"0": 5}, {"0": 0}, "B", None, {}) is None
    assert truncation.decide({"0": 5}, {"0": 0}, None, "A", {}) is None  # no id now: the probe decides
    found = truncation.decide({"0": 5, "1": 0}, {"0": 0, "1": 0}, "B", "A", {})
    assert dict(found.moves) == {"0": (5, 0)}


def test_a_partition_found_moves_the_whole_topic_unless_the_id_vouches_for_it():
    """A topic is re-created as a whole: with no id to vouch for it, one partition found moves
    every partition; the same id (an unclean leader election) moves only the one found; a
    source whose partitions are sources of their own (RabbitMQ streams) only the one found."""
    checkpoint, earliest, held = {"0": 15, "1": 15, "2": 0}, {"0": 0, "1": 0, "2": 0}, {"0": False}
    assert truncation.decide(checkpoint, earliest, None, None, held).moves == {"0": (15, 0), "1": (15, 0)}
    assert truncation.decide(checkpoint, earliest, "B", None, held).moves == {"0": (15, 0), "1": (15, 0)}
    assert truncation.decide(checkpoint, earliest, "A", "A", held).moves == {"0": (15, 0)}
    assert truncation.decide(checkpoint, earliest, None, None, held, whole=False).moves == {"0": (15, 0)}
    found = truncation.decide(checkpoint, earliest, None, None, held)
    assert "partition(s) 1 go back" in found.reason and """'{"0": 0, "1": 0}'""" in found.unhealthy_message("c")
