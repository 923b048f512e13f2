"""The applier reports one supervisor's failure on that supervisor and goes on with the pass.

Issue 10 item 7 and issue 17 item 3: an unexpected exception in one action, an unwritable
state directory, a backfill id taken by a spec, a transient "unknown topic": each becomes a
failed (or annotated) ActionResult, never an exception out of the pass. The database is a
real SQLite file; stream positions are handed in (the brokers' own behaviour is covered by
tests/e2e and tests/streams).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from reconciler.control.apply import Applier
from reconciler.control.plan import Action, ActionKind, PlanSettings, desired_from_directory, plan
from reconciler.control.reconcile import reconcile_once
from reconciler.control.requests import from_cli
from reconciler.control.resets import Positions
from reconciler.errors import RetryableError
from reconciler.model import Position, SupervisorSpec
from reconciler.spec.loader import load_directory
from reconciler.store.store import Store
from reconciler.streams.base import SourceMissing

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
POS = Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 50})


def spec_text(sid: str, topic: str = "clicks") -> str:
    return (f"id: {sid}\nsource:\n  type: kafka\n  bootstrapServers: 127.0.0.1:9\n  topic: {topic}\n"
            f"dataSchema:\n  datasource: {sid}\n  timestamp: {{column: ts}}\n")


def make_spec(sid: str) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "clicks"},
        "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}})


def fixed(spec, position, now):
    return Positions(POS.earliest, POS.latest, start_from=POS.earliest), dict(POS.earliest)


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    yield s
    s.close()


def reset_action(sid: str, op: str = "op1") -> Action:
    req = from_cli(sid, Position("latest"), operation_id=op)
    return Action(ActionKind.RESET_AND_BACKFILL, sid, req.describe(), request=req)


def test_an_unexpected_exception_fails_one_action_and_the_pass_goes_on(store, caplog):
    def broken(spec, position, now):
        raise KeyError("a bug in one adapter")

    store.create_supervisor(make_spec("a"), None, actor="t")
    applier = Applier(store, capture=broken, clock=lambda: NOW)
    results = applier.apply([reset_action("a"), Action(ActionKind.CREATE, "b", "new", spec=make_spec("b"))])
    assert [r.ok for r in results] == [False, True]
    assert results[0].message == "unexpected KeyError: 'a bug in one adapter'"
    assert store.get("b") is not None
    assert any(r.exc_info for r in caplog.records if "a bug in one adapter" in r.getMessage())  # with traceback


def test_unwritable_state_directory_is_reported_and_the_pass_goes_on(store, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "backfills").write_text("not a directory")  # as root, a mode bit would not stop us
    store.create_supervisor(make_spec("a"), None, actor="t")
    store.init_checkpoints("a", {"0": 10, "1": 20})
    applier = Applier(store, state_dir=state, capture=fixed, clock=lambda: NOW)
    [res] = applier.apply([reset_action("a")])
    assert res.ok, res.message
    assert "cannot be written under" in res.message and "will retry" in res.message
    assert store.get("a-backfill-1") is not None  # the reset itself committed
    applier.render_missing_backfills(store.read_actual())  # logs, never raises


def test_a_transient_unknown_topic_is_asked_again_then_applied(store):
    answers = [SourceMissing("topic 'clicks' does not exist"), SourceMissing("topic 'clicks' does not exist")]
    slept = []

    def flaky(spec, position, now):
        if answers:
            raise answers.pop(0)
        return fixed(spec, position, now)

    store.create_supervisor(make_spec("a"), None, actor="t")
    store.init_checkpoints("a", {"0": 10, "1": 20})
    applier = Applier(store, capture=flaky, clock=lambda: NOW, sleep=slept.append)
    [res] = applier.apply([reset_action("a")])
    assert res.ok, res.message
    assert slept == [0.5, 1.0]
    assert store.get("a-backfill-1") is not None


def test_a_persistently_unknown_topic_rejects_a_marker_after_retries(store, tmp_path):
    def missing(spec, position, now):
        raise SourceMissing("topic 'clicks' does not exist on 127.0.0.1:9")

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.yaml").write_text(spec_text("a"))
    store.create_supervisor(make_spec("a"), str(specs / "a.yaml"), actor="t")
    (specs / "a.reset.yaml").write_text("reason: lag\n")
    slept = []
    applier = Applier(store, capture=missing, clock=lambda: NOW, sleep=slept.append)
    result = reconcile_once(str(specs), applier, check_permissions=False)
    [res] = [r for r in result.results if r.action.kind == ActionKind.RESET_AND_BACKFILL]
    assert not res.ok and "asked 5 times over 7.5s" in res.message
    assert slept == [0.5, 1.0, 2.0, 4.0]
    assert (specs / "a.reset.yaml.rejected").exists()


def test_a_retryable_answer_leaves_the_request_pending(store, tmp_path):
    def unreachable(spec, position, now):
        raise RetryableError("cannot reach Kafka at 127.0.0.1:9")

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.yaml").write_text(spec_text("a"))
    store.create_supervisor(make_spec("a"), str(specs / "a.yaml"), actor="t")
    (specs / "a.reset.yaml").write_text("reason: lag\n")
    result = reconcile_once(str(specs), Applier(store, capture=unreachable, clock=lambda: NOW),
                            check_permissions=False)
    [res] = [r for r in result.results if r.action.kind == ActionKind.RESET_AND_BACKFILL]
    assert not res.ok
    assert (specs / "a.reset.yaml").exists() and store.read_actual().handled_tokens == frozenset()
    # the broker is back: the same marker is applied on the next pass
    result = reconcile_once(str(specs), Applier(store, capture=fixed, clock=lambda: NOW), check_permissions=False)
    assert [r.ok for r in result.results] == [True]
    assert (specs / "a.reset.yaml.applied").exists()


def test_spec_named_like_a_backfill_is_refused_and_the_reset_does_not_crash(store, tmp_path):
    """Issue 17 item 3: 'good-backfill-1' beside 'good', then a reset of 'good'."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "good.yaml").write_text(spec_text("good"))
    (specs / "good-backfill-1.yaml").write_text(spec_text("good-backfill-1", topic="other"))
    state = load_directory(str(specs), check_permissions=False)
    [problem] = [str(p) for p in state.problems]
    assert problem.startswith(f"{specs / 'good-backfill-1.yaml'}:1:5: id: ")
    assert "the suffix -backfill-<n> is reserved" in problem

    applier = Applier(store, capture=fixed, clock=lambda: NOW)
    reconcile_once(str(specs), applier, check_permissions=False)
    assert store.get("good-backfill-1") is None
    store.init_checkpoints("good", {"0": 10, "1": 20})
    (specs / "good.reset.yaml").write_text("reason: lag\n")
    result = reconcile_once(str(specs), applier, check_permissions=False)
    assert [r.ok for r in result.results] == [True]
    assert store.get("good-backfill-1").parent_id == "good"


def test_same_marker_bytes_again_is_a_new_request_same_file_is_not(store, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.yaml").write_text(spec_text("a"))
    store.create_supervisor(make_spec("a"), str(specs / "a.yaml"), actor="t")
    store.init_checkpoints("a", {"0": 10, "1": 20})
    applier = Applier(store, capture=fixed, clock=lambda: NOW)
    marker = specs / "a.reset.yaml"
    marker.write_text("reason: lag\n")
    first = desired_from_directory(load_directory(str(specs), check_permissions=False)).markers[0][1].token
    # seen again before it is renamed (a failed rename, a crash): the same token, handled once
    again = desired_from_directory(load_directory(str(specs), check_permissions=False)).markers[0][1].token
    assert first == again
    reconcile_once(str(specs), applier, check_permissions=False)
    marker.write_text("reason: lag\n")  # the same bytes, a new incident
    second = desired_from_directory(load_directory(str(specs), check_permissions=False)).markers[0][1].token
    assert second != first
    actions = plan(desired_from_directory(load_directory(str(specs), check_permissions=False)),
                   store.read_actual(), settings=PlanSettings()).actions
    assert [a.kind for a in actions] == [ActionKind.RESET_AND_BACKFILL]



def test_a_marker_and_a_due_lag_policy_in_one_pass_reset_once(store, tmp_path):
    """A marker and a lag policy's breach due in the same pass: the plan, read before either,
    holds both resets. The marker's goes first and moves the supervisor to latest (epoch
    bumped); the policy's, decided on the observation from before it, used to reset it again,
    with a second backfill. It is not applied now, and not handled: the next pass sees the
    observation is from before the reset (stale), and the observer's next round ends the
    breach."""
    from datetime import timedelta

    from reconciler.control.lagpolicy import LagObservation

    specs = tmp_path / "specs"
    specs.mkdir()
    text = spec_text("a") + "lagPolicy: {maxRecords: 10, for: 0s, action: resetToLatestAndBackfill, cooldown: 10m}\n"
    (specs / "a.yaml").write_text(text)
    applier = Applier(store, capture=fixed, clock=lambda: NOW)
    reconcile_once(str(specs), applier, check_permissions=False)  # creates it
    store.init_checkpoints("a", {"0": 0, "1": 0})
    rec = store.get("a")
    now = datetime.now(UTC)
    store.save_lag([LagObservation("a", now, rec.epoch, 150, 30.0, now - timedelta(seconds=5), now)], now=now)
    (specs / "a.reset.yaml").write_text("reason: lag\n")
    result = reconcile_once(str(specs), applier, check_permissions=False)
    resets = [r for r in result.results if r.action.kind == ActionKind.RESET_AND_BACKFILL]
    assert [r.action.request.trigger for r in resets] == ["marker", "policy"]  # both planned
    assert all(r.ok for r in resets), [r.message for r in resets]
    assert "not applied" in resets[1].message
    backfills = sorted(sid for sid in store.read_actual().supervisors if sid.startswith("a-backfill"))
    assert backfills == ["a-backfill-1"]
    assert store.get("a").epoch == rec.epoch + 1
    again = reconcile_once(str(specs), applier, check_permissions=False)
    assert [r for r in again.results if r.action.kind == ActionKind.RESET_AND_BACKFILL] == []
    assert [d.status.value for d in again.plan.policies] == ["stale"]
