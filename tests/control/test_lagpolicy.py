"""Lag policies as pure functions (issue 32): how a breach starts, holds and ends
(``advance``), what the planner does with it (``decide``, ``plan``), and the token a breach
gives. Named cases; no database, no broker, no clock.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from reconciler.control.actual import Override, State
from reconciler.control.lagpolicy import (
    RECOVER_MIN,
    LagObservation,
    LagState,
    PolicyStatus,
    advance,
    breaches,
    decide,
    human_seconds,
    policy_token,
    recover_after,
)
from reconciler.control.plan import ActionKind, plan
from reconciler.model import LagPolicy, SupervisorSpec
from tests.control.test_plan import actual, backfill_record, desired, record, spec

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
RESET = {"maxRecords": 20000, "maxLag": "1h", "for": "2m", "action": "resetToLatestAndBackfill", "cooldown": "1h",
         "backfillTaskCount": 4}


def policy(**over) -> LagPolicy:
    return LagPolicy.from_document({**RESET, **over})


def seen(records=None, seconds=None, *, since=None, at=NOW, epoch=1, fired=None) -> LagObservation:
    return LagObservation("clicks", at, epoch, records, seconds, since, fired)


def test_the_policy_document():
    p = LagPolicy.from_document(RESET)
    assert (p.max_records, p.max_lag, p.for_seconds, p.action, p.cooldown, p.backfill_task_count) == \
        (20000, 3600.0, 120.0, "resetToLatestAndBackfill", 3600.0, 4)
    d = LagPolicy.from_document({"maxLag": "30m"})
    assert (d.max_records, d.for_seconds, d.action, d.cooldown) == (None, 0.0, "alert", 3600.0)
    assert spec("clicks", lagPolicy=RESET).lag_policy == p
    assert spec("clicks").lag_policy is None


def test_the_reason_says_what_is_over():
    p = policy()
    assert breaches(p, 25_000, 5040.0) == ["25,000 records > 20,000", "1.4h > 1h"]
    assert breaches(p, 20_000, 3600.0) == []  # at the threshold is not over it
    assert breaches(p, None, None) == []  # unknown breaches nothing
    assert [human_seconds(x) for x in (42, 90, 5040)] == ["42s", "1.5m", "1.4h"]


def test_the_token_is_the_breach_whatever_the_zone_it_is_read_in():
    since = datetime(2026, 11, 20, 11, 58, 3, 123456, tzinfo=UTC)
    elsewhere = since.astimezone(timezone(timedelta(hours=-5)))  # PostgreSQL in another session zone
    assert policy_token("clicks", since) == policy_token("clicks", elsewhere) == \
        "policy:clicks:20261120T115803.123456Z"
    assert policy_token("clicks", since) != policy_token("clicks", since + timedelta(microseconds=1))


# --------------------------------------------------------------------------- advance


def test_a_breach_starts_holds_fires_once_and_ends():
    p = policy(**{"for": "2m"})
    first, ev = advance(p, None, supervisor_id="clicks", epoch=1, records=30_000, seconds=10.0, now=NOW)
    assert (first.breach_since, first.fired_at, ev) == (NOW, None, [])
    later = NOW + timedelta(seconds=60)
    held, ev = advance(p, first, supervisor_id="clicks", epoch=1, records=40_000, seconds=10.0, now=later)
    assert (held.breach_since, held.fired_at, ev) == (NOW, None, [])  # keeps its start: the token's
    fire_at = NOW + timedelta(seconds=120)
    fired, ev = advance(p, held, supervisor_id="clicks", epoch=1, records=40_000, seconds=10.0, now=fire_at)
    assert fired.fired_at == fire_at and [e.action for e in ev] == ["lag-breach"]
    assert ev[0].reason == "lag policy: 40,000 records > 20,000 (held 2.0m)"
    again, ev = advance(p, fired, supervisor_id="clicks", epoch=1, records=40_000, seconds=10.0,
                        now=fire_at + timedelta(seconds=5))
    assert ev == [] and again.fired_at == fire_at  # announced once
    unknown, ev = advance(p, again, supervisor_id="clicks", epoch=1, records=None, seconds=None,
                          now=fire_at + timedelta(seconds=10))
    assert ev == [] and unknown.breach_since == NOW  # a broker that did not answer ends nothing
    under, ev = advance(p, unknown, supervisor_id="clicks", epoch=1, records=5, seconds=1.0,
                        now=fire_at + timedelta(seconds=15))
    assert ev == [] and under.under_since == fire_at + timedelta(seconds=15)  # under: not yet for `for`
    over, ev = advance(p, under, supervisor_id="clicks", epoch=1, records=5, seconds=1.0,
                       now=fire_at + timedelta(seconds=135))
    assert over.breach_since is None and [e.action for e in ev] == ["lag-breach-end"]


def test_a_breach_after_a_reset_is_a_new_one():
    p = policy(**{"for": "0s"})
    first, ev = advance(p, None, supervisor_id="clicks", epoch=1, records=30_000, seconds=None, now=NOW)
    assert first.fired_at == NOW and [e.action for e in ev] == ["lag-breach"]  # for: 0s fires at once
    later = NOW + timedelta(seconds=30)
    after, _ = advance(p, first, supervisor_id="clicks", epoch=2, records=30_000, seconds=None, now=later)
    assert after.breach_since == later  # the epoch moved: a new breach, a new token
    ended, ev = advance(p, first, supervisor_id="clicks", epoch=2, records=0, seconds=0.0, now=later)
    assert ended.breach_since is None and ev == []  # the old breach was the reset's, not announced again


# --------------------------------------------------------------------------- decide


def state(o=None, last=None, backfill=None) -> LagState:
    return LagState(observation=o, last_reset_at=last, last_backfill=backfill)


BREACH = seen(30_000, 5040.0, since=NOW - timedelta(minutes=3), fired=NOW - timedelta(minutes=1))
CASES = [
    pytest.param(dict(), None, PolicyStatus.UNOBSERVED, id="unobserved"),
    pytest.param(dict(o=seen(10, 1.0)), None, PolicyStatus.OK, id="within"),
    pytest.param(dict(o=seen(30_000, 1.0, since=NOW - timedelta(minutes=1))), None, PolicyStatus.PENDING,
                 id="not-for-long-enough"),
    pytest.param(dict(o=BREACH), None, PolicyStatus.DUE, id="due"),
    pytest.param(dict(o=BREACH), {"action": "alert"}, PolicyStatus.ALERT, id="alert-changes-nothing"),
    pytest.param(dict(o=BREACH, last=NOW - timedelta(minutes=30), backfill="clicks-backfill-1"), None,
                 PolicyStatus.BACKFILL_RUNNING, id="policy-backfill-running"),
    pytest.param(dict(o=BREACH, last=NOW - timedelta(minutes=30), backfill="clicks-backfill-9"), None,
                 PolicyStatus.COOLING, id="within-cooldown"),
    pytest.param(dict(o=BREACH, last=NOW - timedelta(minutes=61), backfill="clicks-backfill-9"), None,
                 PolicyStatus.DUE, id="cooldown-over"),
    pytest.param(dict(o=seen(30_000, 5040.0, since=NOW - timedelta(hours=1), at=NOW - timedelta(minutes=10))), None,
                 PolicyStatus.STALE, id="observation-too-old"),
    pytest.param(dict(o=seen(30_000, 5040.0, since=NOW - timedelta(hours=1), epoch=0)), None,
                 PolicyStatus.STALE, id="observed-before-a-reset"),
]


@pytest.mark.parametrize(("given", "over", "expected"), CASES)
def test_decide(given, over, expected):
    rec = record(spec("clicks", lagPolicy=RESET))
    running = backfill_record("clicks", 1, State.RUNNING)
    act = actual(rec, running)
    d = decide(rec, policy(**(over or {})), state(**given), act, NOW, suspended=False)
    assert d.status == expected, d.message
    assert (d.request is not None) == (expected == PolicyStatus.DUE)
    if d.request is not None:
        r = d.request
        assert (r.trigger, str(r.position), r.backfill, r.backfill_task_count) == ("policy", "latest", True, 4)
        assert r.token == policy_token("clicks", given["o"].breach_since)
        assert r.reason == "lag policy: 30,000 records > 20,000 and 1.4h > 1h"


def test_a_handled_breach_is_not_planned_again():
    rec = record(spec("clicks", lagPolicy=RESET))
    token = policy_token("clicks", BREACH.breach_since)
    d = decide(rec, policy(), state(BREACH), actual(rec, tokens=[token]), NOW, suspended=False)
    assert d.status == PolicyStatus.APPLIED and d.request is None


@pytest.mark.parametrize("how", ["file", "operator", "state"])
def test_a_suspended_supervisor_is_never_reset(how):
    s = spec("clicks", lagPolicy=RESET, suspended=how == "file")
    rec = record(s, State.SUSPENDED if how == "state" else State.RUNNING)
    act = actual(rec)
    if how == "operator":
        act = type(act)(supervisors=act.supervisors, overrides={"clicks": Override("clicks", "suspend", "INC", "ops",
                                                                                   NOW)})
    p = plan(desired(s), act, now=NOW, lag={"clicks": state(BREACH)})
    assert [a.kind for a in p.actions if a.kind == ActionKind.RESET_AND_BACKFILL] == []
    assert [d.status for d in p.policies] == [PolicyStatus.SUSPENDED]


# --------------------------------------------------------------------------- plan


def test_plan_emits_the_policy_reset_once_and_shows_every_policy():
    with_policy = spec("clicks", lagPolicy=RESET)
    alert = spec("views", lagPolicy={"maxRecords": 5, "action": "alert"})
    plain = spec("other")
    act = actual(record(with_policy), record(alert), record(plain))
    lag = {"clicks": state(BREACH), "views": state(seen(9, 1.0, since=NOW - timedelta(seconds=1)))}
    p = plan(desired(with_policy, alert, plain), act, now=NOW, lag=lag)
    resets = [a for a in p.actions if a.kind == ActionKind.RESET_AND_BACKFILL]
    assert [(a.supervisor_id, a.request.trigger) for a in resets] == [("clicks", "policy")]
    assert [(d.supervisor_id, d.status) for d in p.policies] == [("clicks", PolicyStatus.DUE),
                                                               ("views", PolicyStatus.ALERT)]
    doc = p.to_dict()
    assert doc["actions"][0]["request"]["trigger"] == "policy"
    assert [x["status"] for x in doc["policies"]] == ["due", "alert"]
    assert doc["policies"][0]["observed"]["records"] == 30_000
    # applied: the same breach is not planned again
    again = plan(desired(with_policy, alert, plain), actual(*act.supervisors.values(),
                                                            tokens=[resets[0].request.token]), now=NOW, lag=lag)
    assert [a for a in again.actions if a.kind == ActionKind.RESET_AND_BACKFILL] == []
    # without ``now`` (or without any policy) the plan is what it always was
    assert plan(desired(with_policy), act).policies == ()
    assert "policies" not in plan(desired(plain), actual(record(plain)), now=NOW).to_dict()


def test_an_invalid_file_keeps_its_last_valid_policy():
    s = spec("clicks", lagPolicy=RESET)
    p = plan(desired(invalid={"clicks": "specs/clicks.yaml:3:1: broken"}), actual(record(s)), now=NOW,
             lag={"clicks": state(BREACH)})
    assert [(a.kind, a.request.trigger if a.request else None) for a in p.actions] == [
        (ActionKind.MARK_INVALID, None), (ActionKind.RESET_AND_BACKFILL, "policy")]


# --------------------------------------------------------------------------- issue 41: flapping and poison


def test_a_lag_at_its_threshold_alternating_every_round_is_one_breach_not_a_flap_per_round():
    """41.7: 20,001 / 19,999 records every 5 s for two minutes wrote 24 breach and recovery entries."""
    p = policy(**{"for": "0s", "maxLag": None})
    o, actions = None, []
    for i in range(24):
        o, ev = advance(p, o, supervisor_id="clicks", epoch=1, records=20_001 if i % 2 == 0 else 19_999,
                        seconds=None, now=NOW + timedelta(seconds=5 * i))
        actions += [e.action for e in ev]
    assert actions == ["lag-breach"] and o.breach_since == NOW  # one breach, one token, still on
    last = NOW + timedelta(seconds=5 * 23)
    for i in range(1, 13):  # under for a whole minute (``for`` is 0s: RECOVER_MIN): it ends, once
        o, ev = advance(p, o, supervisor_id="clicks", epoch=1, records=10, seconds=None,
                        now=last + timedelta(seconds=5 * i))
        actions += [e.action for e in ev]
    assert actions == ["lag-breach", "lag-breach-end"] and o.breach_since is None and o.under_since is None


def test_recovery_waits_for_for_and_a_breach_back_over_keeps_its_start():
    p = policy(**{"for": "2m"})
    assert recover_after(p) == 120.0 and recover_after(policy(**{"for": "0s"})) == RECOVER_MIN
    fired = seen(30_000, 10.0, since=NOW - timedelta(minutes=5), fired=NOW - timedelta(minutes=3))
    under, ev = advance(p, fired, supervisor_id="clicks", epoch=1, records=5, seconds=1.0, now=NOW)
    assert ev == [] and under.under_since == NOW
    back, ev = advance(p, under, supervisor_id="clicks", epoch=1, records=30_000, seconds=1.0,
                       now=NOW + timedelta(seconds=119))
    assert ev == [] and back.under_since is None and back.breach_since == fired.breach_since
    again, ev = advance(p, back, supervisor_id="clicks", epoch=1, records=5, seconds=1.0,
                        now=NOW + timedelta(seconds=125))
    assert ev == [] and again.under_since == NOW + timedelta(seconds=125)  # the count starts afresh


def test_a_recovering_breach_is_never_reset():
    rec = record(spec("clicks", lagPolicy=RESET))
    recovering = seen(5, 1.0, since=NOW - timedelta(hours=1), fired=NOW - timedelta(minutes=50))
    d = decide(rec, policy(), state(recovering, last=NOW - timedelta(hours=5)), actual(rec), NOW, suspended=False)
    assert d.status == PolicyStatus.RECOVERING and d.request is None, d.message
    assert "back within the policy" in d.message and "2.0m" in d.message


def poisoned(sid: str) -> SupervisorSpec:
    """A spec whose policy carries a ``for`` no parser accepts any more (stored before issue 41.1)."""
    return replace(spec(sid, lagPolicy=RESET), lag_policy=LagPolicy(max_records=10, for_seconds=100_000_000 * 3600.0,
                                                                   action="resetToLatestAndBackfill"))


def test_a_policy_whose_deadline_overflows_is_an_error_on_its_own_supervisor_only():
    bad, good = poisoned("clicks"), spec("views", lagPolicy=RESET)
    breach = seen(30_000, 5040.0, since=NOW - timedelta(minutes=3))
    lag = {"clicks": state(breach), "views": state(replace(BREACH, supervisor_id="views"))}
    p = plan(desired(bad, good), actual(record(bad), record(good)), now=NOW, lag=lag)
    assert [(a.kind, a.supervisor_id) for a in p.actions] == [(ActionKind.RESET_AND_BACKFILL, "views")]
    assert [(d.supervisor_id, d.status) for d in p.policies] == [("clicks", PolicyStatus.ERROR),
                                                               ("views", PolicyStatus.DUE)]
    assert "OverflowError" in p.policies[0].message and "87600h" in p.policies[0].message
    assert p.to_dict()["policies"][0]["status"] == "error"


def test_a_stored_spec_the_parser_now_refuses_does_not_stop_the_plan():
    doc = {**spec("clicks").document, "lagPolicy": {"maxRecords": 10, "for": "100000000h"}}
    stored = replace(record("clicks"), spec_document=doc)
    with pytest.raises(ValueError, match="too long: at most 87600h"):
        stored.spec  # noqa: B018 - what every reader of the stored spec meets
    good = spec("views", lagPolicy=RESET)
    lag = {"clicks": state(seen(30_000, 5040.0, since=NOW - timedelta(minutes=3))),
           "views": state(replace(BREACH, supervisor_id="views"))}
    p = plan(desired(good, invalid={"clicks": "specs/clicks.yaml:9:8: lagPolicy.for: too long"}),
             actual(stored, record(good)), now=NOW, lag=lag)
    assert [(a.kind, a.supervisor_id) for a in p.actions] == [(ActionKind.MARK_INVALID, "clicks"),
                                                             (ActionKind.RESET_AND_BACKFILL, "views")]
    assert [d.supervisor_id for d in p.policies] == ["views"]
