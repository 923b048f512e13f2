"""The store's freshness queries (issue 32) on SQLite and a real PostgreSQL: lag observations
and the breach start survive as written (the policy's token derives from it); the planner sees
the last policy-made reset; a suspended supervisor is refused by the policy's reset under lock;
milestones and health transitions are audited once; webhook cursors persist.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from reconciler.control.actual import DetailedState, State
from reconciler.control.lagpolicy import LagObservation, policy_request, policy_token
from reconciler.control.requests import ResetRequest
from reconciler.control.resets import Positions, compute_reset
from reconciler.errors import PermanentError, StaleRequest
from reconciler.model import LagPolicy, Position, SupervisorSpec
from reconciler.store.freshness import AuditNote, WebhookCursor
from reconciler.store.store import Store

NOW = datetime(2026, 11, 20, 12, 0, 0, 123456, tzinfo=UTC)
POLICY = {"maxRecords": 100, "for": "0s", "action": "resetToLatestAndBackfill", "cooldown": "10m"}


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    s.migrate()
    spec = SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "clicks"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}, "lagPolicy": POLICY})
    s.create_supervisor(spec, "specs/clicks.yaml", actor="test")
    s.set_state("clicks", State.RUNNING)
    s.init_checkpoints("clicks", {"0": 10})
    try:
        yield s
    finally:
        s.close()


def observation(**over) -> LagObservation:
    values = dict(supervisor_id="clicks", observed_at=NOW, epoch=1, records=500, seconds=12.345,
                  breach_since=NOW - timedelta(seconds=5), fired_at=NOW)
    return LagObservation(**(values | over))


def test_observations_round_trip_to_the_microsecond(store: Store):
    o = observation()
    store.save_lag([o], [AuditNote("clicks", "lag-breach", "policy", "lag policy: 500 records > 100", {"records": 500})],
                   now=NOW)
    got = store.lag_observations()["clicks"]
    assert got == o  # the breach start as written: the token derives from it
    assert policy_token("clicks", got.breach_since) == policy_token("clicks", o.breach_since)
    entry = store.history("clicks")[-1]
    assert (entry["action"], entry["actor"], entry["reason"]) == ("lag-breach", "policy", "lag policy: 500 records > 100")
    store.save_lag([observation(records=None, seconds=None, breach_since=None, fired_at=None)], now=NOW)
    assert store.lag_observations()["clicks"].records is None  # unknown stays unknown
    store.save_lag([], forget=["clicks"], now=NOW)
    assert store.lag_observations() == {}


def _reset(store: Store, o: LagObservation):
    request = policy_request("clicks", LagPolicy.from_document(POLICY), o)
    pos = Positions(earliest={"0": 0}, latest={"0": 1000})
    return request, store.apply_reset(request, lambda cp: compute_reset(Position("latest"), cp, pos, backfill=True),
                                      initial={"0": 0}, earliest={"0": 0}, actor="policy")


def test_the_last_policy_reset_and_its_backfill(store: Store):
    o = observation()
    store.save_lag([o], now=NOW)
    assert store.lag_states()["clicks"].last_reset_at is None
    request, result = _reset(store, o)
    assert result.backfill_id == "clicks-backfill-1"
    state = store.lag_states()["clicks"]
    assert state.last_backfill == "clicks-backfill-1" and state.last_reset_at is not None
    assert state.observation == o
    assert request.token in store.read_actual().handled_tokens
    reset = [e for e in store.history("clicks") if e["action"] == "reset-and-backfill"][0]
    assert reset["actor"] == "policy" and reset["reason"] == "lag policy: 500 records > 100"
    assert "lagPolicy" not in store.get("clicks-backfill-1").spec_document  # a backfill is never reset
    _, again = _reset(store, o)
    assert again.applied_before  # the same breach: once


def test_a_policy_reset_of_a_suspended_supervisor_is_refused_under_lock(store: Store):
    store.set_state("clicks", State.SUSPENDED)
    with pytest.raises(PermanentError, match="never resets a suspended supervisor"):
        _reset(store, observation())
    assert store.checkpoints("clicks") == {"0": 10}


def test_a_policy_reset_decided_before_another_reset_moved_the_epoch_is_not_applied(store: Store):
    """The plan decides a policy's reset from the state read at the start of the pass; the
    reset transaction checked only the token and suspension. Another reset landing first (a
    marker or a ``backfill:`` stanza planned before the policy in the same pass, or an
    operator's ``reconciler reset``) moved the supervisor to latest and bumped its epoch, and
    the policy then reset it again on its stale observation: two resets and two backfills for
    one breach, the second inside what the cooldown should have held. Under the lock, a
    policy's request is applied only at the epoch its observation saw."""
    o = observation(epoch=store.get("clicks").epoch)
    store.save_lag([o], now=NOW)
    request = policy_request("clicks", LagPolicy.from_document(POLICY), o)
    assert request.epoch == o.epoch
    operator = ResetRequest("clicks", "cli:op@host:1", "cli", "op@host", Position("latest"), backfill=True)
    first = store.apply_reset(operator, _to_latest(1000), initial={"0": 0}, earliest={"0": 0}, actor="cli")
    assert first.backfill_id == "clicks-backfill-1"
    epoch = store.get("clicks").epoch
    with pytest.raises(StaleRequest, match="observed again"):
        store.apply_reset(request, _to_latest(1200), initial={"0": 0}, earliest={"0": 0}, actor="policy")
    assert store.get("clicks").epoch == epoch and store.checkpoints("clicks") == {"0": 1000}
    assert "clicks-backfill-2" not in store.read_actual().supervisors
    assert request.token not in store.read_actual().handled_tokens  # not handled: the next pass decides afresh
    assert store.lag_states()["clicks"].last_reset_at is None


def _to_latest(latest: int):
    pos = Positions(earliest={"0": 0}, latest={"0": latest})
    return lambda cp: compute_reset(Position("latest"), cp, pos, backfill=True)


def test_health_transitions_are_audited_once(store: Store):
    def actions():
        return [e["action"] for e in store.history("clicks") if e["action"] in ("unhealthy", "recovered")]

    store.set_detailed("clicks", State.RUNNING, DetailedState.LOST_CONTACT_WITH_STREAM, "one failure")
    assert actions() == []
    store.set_detailed("clicks", State.UNHEALTHY_SUPERVISOR, DetailedState.LOST_CONTACT_WITH_STREAM, "broker down")
    store.set_detailed("clicks", State.UNHEALTHY_TASKS, DetailedState.UNHEALTHY_TASKS, "still down")
    assert actions() == ["unhealthy"]
    store.set_detailed("clicks", State.RUNNING, DetailedState.RUNNING, None)
    store.set_detailed("clicks", State.IDLE, DetailedState.IDLE, None)
    assert actions() == ["unhealthy", "recovered"]
    entry = [e for e in store.history("clicks") if e["action"] == "unhealthy"][0]
    assert entry["reason"] == "broker down" and entry["details"]["state"] == "UNHEALTHY_SUPERVISOR"


def test_milestones_are_recorded_once(store: Store):
    assert store.record_milestone("clicks-backfill-1", 25, {"done": 25, "total": 100}, now=NOW)
    assert not store.record_milestone("clicks-backfill-1", 25, {"done": 30, "total": 100}, now=NOW)
    assert store.record_milestone("clicks-backfill-1", 50, {"done": 50, "total": 100}, now=NOW)
    assert store.backfill_milestones(["clicks-backfill-1", "x"]) == {"clicks-backfill-1": {25, 50}, "x": set()}


def test_webhook_cursors_and_what_they_wait_for(store: Store):
    for _ in range(3):
        store.audit("clicks", "note", "test")
    top = store.last_audit_id()
    assert top >= 3
    c = WebhookCursor("a" * 64, "http://127.0.0.1:9#aaaaaa", top - 2)
    store.save_webhook_cursor(c, now=NOW)
    store.save_webhook_cursor(WebhookCursor(c.endpoint, c.label, top - 1, NOW, "HTTP 503"), now=NOW)
    [got] = store.webhook_cursors()
    assert (got.last_id, got.failing_since, got.last_error, got.pending) == (top - 1, NOW, "HTTP 503", 1)
    assert [e["id"] for e in store.audit_after(top - 2)] == [top - 1, top]
    assert got.to_dict()["failing"] and got.to_dict()["endpoint"] == "http://127.0.0.1:9#aaaaaa"


def test_recent_batches_and_last_commits(store: Store):
    from reconciler.model import PartitionRange

    for i, at in enumerate((NOW, NOW + timedelta(seconds=5))):
        store.publish(supervisor_id="clicks", epoch=store.get("clicks").epoch, batch_id=f"b{i}", datasource="clicks",
                      ranges=[PartitionRange("0", 10 + i, 11 + i)], files=[], records=1, unparseable=0, now=at)
    assert [b["batch_id"] for b in store.recent_batches("clicks")] == ["b1", "b0"]
    assert store.recent_batches("clicks")[0]["ranges"] == [["0", 11, 12]]
    assert store.last_commits() == {"clicks": NOW + timedelta(seconds=5)}
