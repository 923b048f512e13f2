"""The metadata store, on SQLite and on a real PostgreSQL (the ``db_url`` fixture).

Each public Store method is one transaction; these tests check what each one
leaves behind, and that the compare-and-swap publish and the reset transaction
keep exactly-once under races.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
import sqlalchemy as sa

from reconciler.control.actual import DetailedState, Kind, State
from reconciler.control.requests import ResetRequest, from_cli, from_stanza
from reconciler.control.resets import Positions, compute_reset
from reconciler.errors import PermanentError, PublishConflict
from reconciler.model import PartitionRange, Position, SupervisorSpec
from reconciler.store.store import SegmentFile, Store


def make_spec(sid: str = "clicks", **over) -> SupervisorSpec:
    doc = {
        "id": sid,
        "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "clicks",
                   "consumerProperties": {"sasl.password": "${env:KAFKA_PASSWORD}"}},
        "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}},
    }
    doc.update(over)
    return SupervisorSpec.from_document(doc)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def clicks(store: Store) -> SupervisorSpec:
    """A main supervisor 'clicks' with checkpoints {0: 10, 1: 20}."""
    spec = make_spec()
    store.create_supervisor(spec, "specs/clicks.yaml", actor="test")
    store.init_checkpoints("clicks", {"0": 10, "1": 20})
    return spec


def seg(name: str, rows: int = 5) -> SegmentFile:
    return SegmentFile(segment=name, interval_start=f"{name}:00", interval_end=f"{name}:59", path=f"/seg/{name}.parquet",
                       rows=rows, bytes=rows * 100)


def publish(store: Store, batch_id: str, ranges: list[tuple[str, int, int]], *, epoch: int = 1,
            files: tuple[SegmentFile, ...] = (), lease=None) -> None:
    store.publish(supervisor_id="clicks", epoch=epoch, batch_id=batch_id, datasource="clicks",
                  ranges=[PartitionRange(*r) for r in ranges], files=files,
                  records=sum(r[2] - r[1] for r in ranges), unparseable=0, lease=lease)


def count(store: Store, table: str) -> int:
    with store.engine.connect() as c:
        return c.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()


# --------------------------------------------------------------------------- migrations


def test_migrate_twice_is_idempotent(db_url):
    s = Store(db_url)
    try:
        assert s.revision() is None
        assert s.migrate() == "0006"
        assert s.migrate() == "0006"
        assert s.revision() == "0006"
        assert count(s, "alembic_version") == 1
        assert s.read_actual().supervisors == {}
    finally:
        s.close()


def test_migrate_keeps_data(store: Store, clicks):
    store.migrate()
    assert store.checkpoints("clicks") == {"0": 10, "1": 20}
    assert store.get("clicks").spec_hash == clicks.spec_hash


# --------------------------------------------------------------------------- lifecycle


def test_create_reads_back(store: Store, clicks):
    rec = store.get("clicks")
    assert (rec.kind, rec.state, rec.detailed_state, rec.epoch) == (Kind.MAIN, State.PENDING, DetailedState.PENDING, 1)
    assert rec.spec == clicks
    assert rec.spec_hash == clicks.spec_hash
    assert rec.spec_path == "specs/clicks.yaml"
    assert rec.last_error is None
    assert rec.last_attempted_hash == clicks.spec_hash
    assert rec.created_at.tzinfo is not None and rec.updated_at.tzinfo is not None
    assert store.get("nope") is None
    actual = store.read_actual()
    assert list(actual.supervisors) == ["clicks"]
    assert actual.checkpoints == {"clicks": {"0": 10, "1": 20}}


def test_create_suspended_spec_starts_suspended(store: Store):
    store.create_supervisor(make_spec("quiet", suspended=True), None, actor="test")
    assert store.get("quiet").state == State.SUSPENDED


def test_lifecycle_keeps_checkpoints(store: Store, clicks):
    changed = make_spec(taskCount=4)
    store.update_spec(changed, "specs/clicks.yaml", actor="test")
    rec = store.get("clicks")
    assert (rec.spec_hash, rec.spec.task_count, rec.epoch) == (changed.spec_hash, 4, 1)  # update keeps the epoch

    store.set_state("clicks", State.SUSPENDED, actor="test", reason="suspended: true")
    assert store.get("clicks").state == State.SUSPENDED
    store.set_state("clicks", State.PENDING, actor="test", reason="suspended: false")
    store.set_state("clicks", State.TERMINATED, DetailedState.TERMINATED, actor="test", reason="spec file removed",
                    bump_epoch=True)
    rec = store.get("clicks")
    assert (rec.state, rec.detailed_state, rec.epoch) == (State.TERMINATED, DetailedState.TERMINATED, 2)
    assert store.checkpoints("clicks") == {"0": 10, "1": 20}

    store.create_supervisor(changed, "specs/clicks.yaml", actor="test")  # the file is back
    rec = store.get("clicks")
    assert (rec.state, rec.epoch) == (State.PENDING, 3)
    assert store.checkpoints("clicks") == {"0": 10, "1": 20}
    # init_checkpoints never overwrites: the kept checkpoint wins over startFrom
    assert store.init_checkpoints("clicks", {"0": 0, "1": 0, "2": 0}) == {"0": 10, "1": 20, "2": 0}
    assert store.checkpoints("clicks") == {"0": 10, "1": 20, "2": 0}
    actions = [h["action"] for h in store.history("clicks")]
    assert actions == ["create", "update", "suspended", "pending", "terminated", "recreate"]


def test_mark_invalid_keeps_the_last_valid_spec(store: Store, clicks):
    err = "specs/clicks.yaml:8:3: source.topc: unknown key (did you mean 'topic'?)"
    store.mark_invalid("clicks", err, "abc", actor="test", path="specs/clicks.yaml")
    rec = store.get("clicks")
    assert (rec.spec_hash, rec.last_error, rec.last_attempted_hash) == (clicks.spec_hash, err, "abc")
    assert rec.state == State.PENDING
    [*_, entry] = store.history("clicks")
    assert (entry["action"], entry["reason"], entry["trigger"]) == ("mark-invalid", err, "specs/clicks.yaml")
    store.update_spec(clicks, "specs/clicks.yaml", actor="test")  # valid again
    assert store.get("clicks").last_error is None


def test_set_detailed_does_not_revive_terminated(store: Store, clicks):
    store.set_detailed("clicks", State.RUNNING, DetailedState.RUNNING, None)
    assert store.get("clicks").state == State.RUNNING
    store.set_state("clicks", State.TERMINATED, bump_epoch=True)
    store.set_detailed("clicks", State.UNHEALTHY_TASKS, DetailedState.UNHEALTHY_TASKS, "boom")
    rec = store.get("clicks")
    assert (rec.state, rec.last_error) == (State.TERMINATED, None)


def test_create_refuses_an_id_taken_by_a_backfill(store: Store, clicks):
    store.apply_reset(cli_request(), latest_compute({"0": 50, "1": 20}), initial={}, actor="test")
    with pytest.raises(PermanentError, match="taken by a generated backfill supervisor"):
        store.create_supervisor(make_spec("clicks-backfill-1"), None, actor="test")
    assert store.get("clicks-backfill-1").kind == Kind.BACKFILL


# --------------------------------------------------------------------------- publish (CAS)


def test_publish_moves_checkpoints_and_inserts_segments(store: Store, clicks):
    publish(store, "b1", [("0", 10, 15), ("1", 20, 22)], files=(seg("20261120T10"), seg("20261120T11", 2)))
    assert store.checkpoints("clicks") == {"0": 15, "1": 22}
    rows = store.segments("clicks")
    assert [(r["segment"], r["rows"], r["bytes"], r["batch_id"]) for r in rows] == [
        ("20261120T10", 5, 500, "b1"), ("20261120T11", 2, 200, "b1")]
    assert json.loads(rows[0]["ranges"]) == [["0", 10, 15], ["1", 20, 22]]
    assert store.committed_batch_ids(["b1", "b2"]) == {"b1"}
    totals = store.batch_totals("clicks")
    assert (totals.batches, totals.records, totals.unparseable) == (1, 7, 0)
    assert totals.first.tzinfo is not None
    assert store.segments("other") == []


def test_second_publish_from_the_same_start_conflicts(store: Store, clicks):
    publish(store, "b1", [("0", 10, 15)], files=(seg("h1"),))
    with pytest.raises(PublishConflict, match="partition 0 checkpoint is no longer 10; batch b2 discarded"):
        publish(store, "b2", [("0", 10, 15)], files=(seg("h2"),))
    assert store.checkpoints("clicks") == {"0": 15, "1": 20}
    assert [r["batch_id"] for r in store.segments("clicks")] == ["b1"]
    assert store.committed_batch_ids(["b2"]) == set()
    assert count(store, "batches") == 1


def test_conflict_on_one_partition_moves_no_partition(store: Store, clicks):
    with pytest.raises(PublishConflict):
        publish(store, "b1", [("0", 10, 15), ("1", 19, 25)], files=(seg("h1"),))
    assert store.checkpoints("clicks") == {"0": 10, "1": 20}
    assert count(store, "segments") == 0


def test_stale_epoch_conflicts(store: Store, clicks):
    with pytest.raises(PublishConflict, match="epoch is no longer 7"):
        publish(store, "b1", [("0", 10, 15)], epoch=7, files=(seg("h1"),))
    assert store.checkpoints("clicks") == {"0": 10, "1": 20}
    assert count(store, "segments") == 0 and count(store, "batches") == 0


def test_terminate_fences_an_in_flight_batch(store: Store, clicks):
    store.set_state("clicks", State.TERMINATED, bump_epoch=True)
    with pytest.raises(PublishConflict):
        publish(store, "b1", [("0", 10, 15)], epoch=1)
    assert store.checkpoints("clicks") == {"0": 10, "1": 20}


@pytest.mark.parametrize("round_", range(3))
def test_racing_publishes_one_wins(store: Store, clicks, round_):
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def run(batch_id: str) -> None:
        barrier.wait()
        try:
            publish(store, batch_id, [("0", 10, 15), ("1", 20, 30)], files=(seg(batch_id),))
            outcomes[batch_id] = "won"
        except PublishConflict:
            outcomes[batch_id] = "conflict"
        except Exception as exc:  # noqa: BLE001 - reported below
            outcomes[batch_id] = f"error: {exc!r}"

    threads = [threading.Thread(target=run, args=(f"r{round_}-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes.values()) == ["conflict", "won"], outcomes
    [winner] = [b for b, o in outcomes.items() if o == "won"]
    assert store.checkpoints("clicks") == {"0": 15, "1": 30}
    assert [r["batch_id"] for r in store.segments("clicks")] == [winner]
    assert count(store, "batches") == 1


# --------------------------------------------------------------------------- reset and backfill


def latest_compute(latest: dict[str, int], *, backfill: bool = True):
    pos = Positions(earliest={p: 0 for p in latest}, latest=latest)
    return partial(compute_reset, Position("latest"), positions=pos, backfill=backfill)


def cli_request(op: str = "op1", *, backfill: bool = True) -> ResetRequest:
    return from_cli("clicks", Position("latest"), operation_id=op, backfill=backfill, reason="lag alarm INC-42")


def test_apply_reset_creates_backfill_and_moves_checkpoint(store: Store, clicks):
    req = cli_request()
    result = store.apply_reset(req, latest_compute({"0": 100, "1": 20}), initial={}, actor="cli:ops")
    assert (result.backfill_id, result.applied_before) == ("clicks-backfill-1", False)
    assert result.outcome.backfill_ranges == {"0": (10, 100)}

    main = store.get("clicks")
    assert main.epoch == 2
    assert store.checkpoints("clicks") == {"0": 100, "1": 20}

    bf = store.get("clicks-backfill-1")
    assert (bf.kind, bf.parent_id, bf.state, bf.epoch) == (Kind.BACKFILL, "clicks", State.PENDING, 1)
    assert bf.start_offsets == {"0": 10}  # the empty partition 1 is omitted
    assert bf.end_offsets == {"0": 100}
    assert bf.bounded
    assert bf.spec_document["id"] == "clicks-backfill-1"
    assert bf.spec.source == clicks.source
    assert store.checkpoints("clicks-backfill-1") == {"0": 10}

    [entry] = [h for h in store.history("clicks") if h["action"] == "reset-and-backfill"]
    assert entry["actor"] == "cli:ops"
    assert entry["reason"] == "lag alarm INC-42"
    assert entry["trigger"].startswith("cli: ")
    assert entry["details"]["backfill"] == "clicks-backfill-1"
    assert entry["details"]["backfillRecords"] == 90
    assert [(p["partition"], p["checkpoint"], p["new"]) for p in entry["details"]["partitions"]] == [
        ("0", 10, 100), ("1", 20, 20)]
    assert [h["action"] for h in store.history("clicks-backfill-1")] == ["create-backfill"]

    handled = store.request(req.token)
    assert (handled.status, handled.supervisor_id, handled.kind) == ("applied", "clicks", "cli")
    assert req.token in store.read_actual().handled_tokens


def test_in_flight_batch_from_the_old_checkpoint_is_discarded(store: Store, clicks):
    store.apply_reset(cli_request(), latest_compute({"0": 100, "1": 20}), initial={}, actor="test")
    with pytest.raises(PublishConflict):
        publish(store, "late", [("0", 10, 40)], epoch=1, files=(seg("late"),))
    assert store.segments("clicks") == []
    publish(store, "next", [("0", 100, 110)], epoch=2)  # the main continues from the new checkpoint
    assert store.checkpoints("clicks")["0"] == 110


def test_same_token_twice_is_applied_once(store: Store, clicks):
    req = cli_request()
    store.apply_reset(req, latest_compute({"0": 100, "1": 20}), initial={}, actor="test")
    again = store.apply_reset(req, latest_compute({"0": 500, "1": 500}), initial={}, actor="test")
    assert again.applied_before is True
    assert again.backfill_id == "clicks-backfill-1"
    assert again.outcome.partitions == ()
    assert store.get("clicks-backfill-2") is None
    assert store.get("clicks").epoch == 2
    assert store.checkpoints("clicks") == {"0": 100, "1": 20}
    assert [h["action"] for h in store.history("clicks")].count("reset-and-backfill") == 1


def test_next_request_numbers_the_next_backfill(store: Store, clicks):
    store.apply_reset(cli_request("op1"), latest_compute({"0": 100, "1": 20}), initial={}, actor="test")
    second = store.apply_reset(cli_request("op2"), latest_compute({"0": 150, "1": 30}), initial={}, actor="test")
    assert second.backfill_id == "clicks-backfill-2"
    assert store.get("clicks-backfill-2").start_offsets == {"0": 100, "1": 20}
    assert store.get("clicks-backfill-2").end_offsets == {"0": 150, "1": 30}
    assert store.get("clicks").epoch == 3


def test_reset_without_backfill_skips(store: Store, clicks):
    result = store.apply_reset(cli_request(backfill=False), latest_compute({"0": 100, "1": 20}, backfill=False),
                               initial={}, actor="test")
    assert result.backfill_id is None
    assert result.outcome.warnings == ("no backfill: 90 records will be skipped",)
    assert store.checkpoints("clicks") == {"0": 100, "1": 20}
    assert [h["action"] for h in store.history("clicks")][-1] == "reset"
    assert [sid for sid in store.read_actual().supervisors] == ["clicks"]


def test_reset_fills_missing_checkpoints_from_initial(store: Store):
    store.create_supervisor(make_spec(), None, actor="test")
    result = store.apply_reset(cli_request(), latest_compute({"0": 100, "1": 60}), initial={"0": 40, "1": 60},
                               actor="test")
    assert result.outcome.backfill_ranges == {"0": (40, 100)}
    assert store.checkpoints("clicks") == {"0": 100, "1": 60}


def test_stanza_reset_records_last_request(store: Store):
    spec = make_spec(backfill={"request": "inc-1", "resetTo": "latest"})
    store.create_supervisor(spec, None, actor="test")
    store.init_checkpoints("clicks", {"0": 0})
    req = from_stanza(spec)
    store.apply_reset(req, latest_compute({"0": 9}), initial={}, actor="test")
    assert store.get("clicks").last_request == "inc-1"
    assert "backfill" not in store.get("clicks-backfill-1").spec_document  # the stanza is not inherited


def test_refused_reset_changes_nothing(store: Store, clicks):
    req = from_cli("clicks", Position("earliest"), operation_id="op1")
    pos = Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 100})
    with pytest.raises(PermanentError, match="would read 10 records again"):
        store.apply_reset(req, partial(compute_reset, Position("earliest"), positions=pos, backfill=True),
                          initial={}, actor="test")
    assert store.request(req.token) is None
    assert store.get("clicks").epoch == 1
    assert store.checkpoints("clicks") == {"0": 10, "1": 20}


def test_reset_of_unknown_supervisor(store: Store):
    with pytest.raises(PermanentError, match="unknown supervisor 'clicks'"):
        store.apply_reset(cli_request(), latest_compute({"0": 1}), initial={}, actor="test")


def test_record_rejected_once(store: Store, clicks):
    store.record_rejected("marker:t1", "clicks", "marker", "bad marker", actor="test", trigger="specs/x.reset.yaml")
    store.record_rejected("marker:t1", "clicks", "marker", "bad marker", actor="test", trigger="specs/x.reset.yaml")
    handled = store.request("marker:t1")
    assert (handled.status, handled.result) == ("rejected", {"reason": "bad marker"})
    assert [h["action"] for h in store.history("clicks")].count("reject-request") == 1
    assert "marker:t1" in store.read_actual().handled_tokens


# --------------------------------------------------------------------------- leases


def test_leases(store: Store, clicks):
    t0 = datetime.now(UTC)
    assert store.acquire_lease("a", 15, now=t0) == 1
    assert store.acquire_lease("a", 15, now=t0 + timedelta(seconds=5)) == 1  # renewal keeps the token
    assert store.acquire_lease("b", 15, now=t0 + timedelta(seconds=10)) is None  # standby
    lease = store.lease()
    assert (lease.holder, lease.token) == ("a", 1)
    assert lease.expires_at == t0 + timedelta(seconds=20)
    # a's lease ran out: b takes over with a new fencing token
    assert store.acquire_lease("b", 15, now=t0 + timedelta(seconds=21)) == 2
    assert store.acquire_lease("a", 15, now=t0 + timedelta(seconds=22)) is None
    assert store.lease().holder == "b"
    with pytest.raises(PublishConflict, match="leader lease lost by a"):
        publish(store, "stale", [("0", 10, 15)], lease=("a", 1))
    assert store.checkpoints("clicks") == {"0": 10, "1": 20}
    publish(store, "fresh", [("0", 10, 15)], lease=("b", 2))
    assert store.checkpoints("clicks")["0"] == 15


def test_expired_lease_fences_publish(store: Store, clicks):
    assert store.acquire_lease("a", 15, now=datetime.now(UTC) - timedelta(seconds=60)) == 1
    with pytest.raises(PublishConflict):
        publish(store, "b1", [("0", 10, 15)], lease=("a", 1))
    assert store.checkpoints("clicks")["0"] == 10


def test_release_lets_a_standby_take_over(store: Store):
    assert store.acquire_lease("a", 60) == 1
    assert store.acquire_lease("b", 60) is None
    store.release_lease("a")
    assert store.acquire_lease("b", 60) == 2
    assert store.lease().holder == "b"
    assert store.lease(name="other") is None


# --------------------------------------------------------------------------- audit


def test_history_in_order(store: Store, clicks):
    store.update_spec(make_spec(taskCount=2), None, actor="a1")
    store.audit("clicks", "note", "a2", reason="first")
    store.audit("clicks", "note", "a3", reason="second")
    store.set_state("clicks", State.SUSPENDED, actor="a4")
    store.audit("other", "note", "x")
    hist = store.history("clicks")
    assert [(h["action"], h["actor"]) for h in hist] == [
        ("create", "test"), ("update", "a1"), ("note", "a2"), ("note", "a3"), ("suspended", "a4")]
    assert [h["id"] for h in hist] == sorted(h["id"] for h in hist)
    assert all(h["at"].tzinfo is not None for h in hist)
    assert [h["at"] for h in hist] == sorted(h["at"] for h in hist)
    assert hist[0]["details"] == {"specHash": clicks.spec_hash, "state": "PENDING"}
    assert store.history("nobody") == []


def test_secrets_in_audit_details_are_redacted(store: Store, clicks):
    store.audit("clicks", "note", "test", details={
        "consumerProperties": {"sasl.password": "hunter2", "bootstrap.servers": "b:9092"},
        "uri": "rabbitmq-stream://guest:s3cret@127.0.0.1:5552/%2f",
        "ref": "${env:RMQ_PASSWORD}",
        "token": "abc123",
    })
    [*_, entry] = store.history("clicks")
    assert entry["details"] == {
        "consumerProperties": {"sasl.password": "***", "bootstrap.servers": "b:9092"},
        "uri": "rabbitmq-stream://guest:***@127.0.0.1:5552/%2f",
        "ref": "${env:RMQ_PASSWORD}",
        "token": "***",
    }
    with store.engine.connect() as c:
        raw = " ".join(c.execute(sa.text("SELECT details FROM audit_log WHERE details IS NOT NULL")).scalars())
    assert "hunter2" not in raw and "s3cret" not in raw and "abc123" not in raw


# --------------------------------------------------------------------------- issue 10 / 17: reports, not crashes


@pytest.mark.parametrize("round_", range(2))
def test_same_request_from_two_processes_at_once(db_url: str, store: Store, clicks, round_):
    """Two processes (two engines) apply the same request together: one applies it, the other
    sees "already applied" (on PostgreSQL this used to be an IntegrityError out of the pass)."""
    stores = [Store(db_url), Store(db_url)]
    barrier = threading.Barrier(2)
    outcomes: dict[int, str] = {}
    req = cli_request(f"race-{round_}")

    def slow(checkpoint):
        time.sleep(0.3)  # both are past their first look before either commits
        return latest_compute({"0": 100, "1": 20})(checkpoint)

    def run(i: int) -> None:
        barrier.wait()
        try:
            res = stores[i].apply_reset(req, slow, initial={}, actor=f"p{i}")
            outcomes[i] = "already" if res.applied_before else f"applied {res.backfill_id}"
        except Exception as exc:  # noqa: BLE001 - reported below
            outcomes[i] = f"error: {exc!r}"

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for s in stores:
            s.close()
    assert sorted(outcomes.values()) == ["already", "applied clicks-backfill-1"], outcomes
    assert store.get("clicks").epoch == 2
    assert store.get("clicks-backfill-2") is None
    assert store.checkpoints("clicks") == {"0": 100, "1": 20}


def test_backfill_ids_never_collide_with_a_taken_id(store: Store, clicks):
    """A main supervisor that took the name 'clicks-backfill-1' (the schema refuses that now,
    but an older database may hold one) does not make the reset of 'clicks' fail, then or
    after it is terminated: the next number is one past the highest, skipping taken ids."""
    store.create_supervisor(make_spec("clicks-backfill-1"), "specs/clicks-backfill-1.yaml", actor="test")
    first = store.apply_reset(cli_request("op1"), latest_compute({"0": 100, "1": 20}), initial={}, actor="test")
    assert first.backfill_id == "clicks-backfill-2"
    store.set_state("clicks-backfill-1", State.TERMINATED, actor="test")
    second = store.apply_reset(cli_request("op2"), latest_compute({"0": 150, "1": 20}), initial={}, actor="test")
    assert second.backfill_id == "clicks-backfill-3"
    assert store.get("clicks-backfill-3").start_offsets == {"0": 100}


def test_backfill_numbers_do_not_count_other_prefixes(store: Store, clicks):
    store.create_supervisor(make_spec("clicks-backfill-x"), None, actor="test")
    store.create_supervisor(make_spec("clicks2"), None, actor="test")
    res = store.apply_reset(cli_request("op1"), latest_compute({"0": 100, "1": 20}), initial={}, actor="test")
    assert res.backfill_id == "clicks-backfill-1"


def test_partition_added_after_start_is_filled_from_earliest(store: Store, clicks):
    """startFrom: latest fills only a supervisor that never had a checkpoint; partition 2,
    added later, starts at its earliest offset, so its records are in the backfill."""
    pos = Positions(earliest={"0": 0, "1": 0, "2": 5}, latest={"0": 100, "1": 20, "2": 50})
    compute = partial(compute_reset, Position("latest"), positions=pos, backfill=True)
    res = store.apply_reset(cli_request(), compute, initial=dict(pos.latest), earliest=pos.earliest, actor="test")
    assert res.outcome.backfill_ranges == {"0": (10, 100), "2": (5, 50)}
    assert res.outcome.backfill_records == 90 + 45
    assert sum(p.skipped for p in res.outcome.partitions) == 0
    assert store.checkpoints("clicks") == {"0": 100, "1": 20, "2": 50}


def test_never_started_supervisor_is_filled_from_start_from(store: Store):
    store.create_supervisor(make_spec(), None, actor="test")
    pos = Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 20})
    compute = partial(compute_reset, Position("latest"), positions=pos, backfill=True)
    res = store.apply_reset(cli_request(), compute, initial=dict(pos.latest), earliest=pos.earliest, actor="test")
    assert res.backfill_id is None and res.outcome.backfill_records == 0


def test_reset_behind_retention_records_the_loss(store: Store, clicks):
    """Retention deleted [10, 40) of partition 0: the backfill starts at 40 and the loss is in
    the audit log (range and count) and the request's result."""
    pos = Positions(earliest={"0": 40, "1": 0}, latest={"0": 100, "1": 20})
    compute = partial(compute_reset, Position("latest"), positions=pos, backfill=True)
    req = cli_request()
    res = store.apply_reset(req, compute, initial={}, earliest=pos.earliest, actor="test")
    assert res.outcome.backfill_ranges == {"0": (40, 100)}
    assert (res.outcome.lost_records, res.outcome.lost_ranges) == (30, {"0": (10, 40)})
    assert store.get(res.backfill_id).start_offsets == {"0": 40}
    [entry] = [e for e in store.history("clicks") if e["action"] == "reset-and-backfill"]
    assert (entry["details"]["lostRecords"], entry["details"]["lostRanges"]) == (30, {"0": [10, 40]})
    assert store.request(req.token).result["lostRecords"] == 30


def test_long_request_ids_are_compared_in_full(store: Store):
    """Two stanza request ids that share their first 160 characters are two requests."""
    head = "inc-" + "x" * 190
    tokens = []
    for tail in ("a", "b"):
        spec = make_spec("clicks", backfill={"request": head + tail})
        if store.get("clicks") is None:
            store.create_supervisor(spec, None, actor="test")
            store.init_checkpoints("clicks", {"0": 10, "1": 20})
        req = from_stanza(spec)
        tokens.append(req.token)
        res = store.apply_reset(req, latest_compute({"0": 100 if tail == "a" else 200, "1": 20}), initial={},
                                actor="test")
        assert not res.applied_before
    assert len(set(tokens)) == 2 and all(len(t) <= 160 for t in tokens)
    assert store.checkpoints("clicks")["0"] == 200


def test_fresh_start_drops_the_old_checkpoints_and_fences(store: Store, clicks):
    moved = make_spec(source={"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "clicks-v2"},
                      freshStart=True)
    store.update_spec(moved, "specs/clicks.yaml", actor="test", fresh_start="topic changed from 'clicks' to 'clicks-v2'")
    assert store.checkpoints("clicks") == {}
    assert store.get("clicks").epoch == 2  # a batch of the old topic in flight cannot publish
    [entry] = [e for e in store.history("clicks") if e["action"] == "fresh-start"]
    assert entry["details"] == {"droppedCheckpoints": {"0": 10, "1": 20}, "generation": 1}
    assert store.get("clicks").generation == 1  # verify keeps the old source's offsets apart
    with pytest.raises(PublishConflict):
        publish(store, "old-topic", [("0", 10, 15)], epoch=1)


def test_recreate_with_fresh_start_drops_the_old_checkpoints(store: Store, clicks):
    store.set_state("clicks", State.TERMINATED, actor="test", bump_epoch=True)
    moved = make_spec(source={"type": "kafka", "bootstrapServers": "10.0.0.9:9092", "topic": "clicks"},
                      freshStart=True)
    store.create_supervisor(moved, "specs/clicks.yaml", actor="test", fresh_start="cluster changed")
    assert store.checkpoints("clicks") == {}
    assert store.get("clicks").state == State.PENDING


@pytest.mark.parametrize("position, latest, backfill_id", [
    pytest.param(Position("offsets", offsets={"0": 0, "1": 0}), {"0": 100, "1": 20}, None, id="rewind"),
    pytest.param(Position("latest"), {"0": 10, "1": 20}, None, id="latest-caught-up"),
    pytest.param(Position("latest"), {"0": 100, "1": 20}, "clicks-backfill-1", id="latest-behind"),
])
def test_the_audit_names_a_reset_by_whether_a_backfill_was_created(store: Store, clicks, position, latest,
                                                                    backfill_id):
    """Issue 46: a rewind asked with --backfill (the CLI's default) creates no backfill, and was
    recorded as reset-and-backfill."""
    req = from_cli("clicks", position, operation_id="op1", backfill=True, allow_rewind=True)
    pos = Positions(earliest={p: 0 for p in latest}, latest=latest)
    result = store.apply_reset(req, partial(compute_reset, position, positions=pos, backfill=True, allow_rewind=True),
                               initial={}, actor="test")
    assert result.backfill_id == backfill_id
    [entry] = [h for h in store.history("clicks") if h["action"] in ("reset", "reset-and-backfill")]
    assert entry["action"] == ("reset-and-backfill" if backfill_id else "reset")
    assert entry["details"]["backfill"] == backfill_id
