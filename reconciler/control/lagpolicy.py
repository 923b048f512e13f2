"""Lag policies: when a supervisor's lag has passed its ``lagPolicy`` long enough, what to do.

Pure, like the planner that calls it: the observed lag arrives as data (``LagState``, built by
the store from what the daemon's lag observer persisted), and ``now`` is handed in.

Why the breach start is persisted, and the token derives from it: the reset a policy makes is
an ordinary reset request (``ResetRequest`` with trigger ``policy``) applied by the same
``Store.apply_reset`` transaction as a marker's, which records the request's token. The token
is ``policy:<supervisor>:<breach start>``. A daemon that crashes after the breach was recorded
but before the reset committed finds the same breach start after its restart, plans the same
token and applies it once; one that crashes after the commit finds the token handled and
plans nothing. A breach ends when the supervisor's epoch moved (a reset, a re-create): a new
breach after that is a new request. Otherwise, one not yet announced ends at the first
observation back under the thresholds; one announced (``lag-breach``) ends only once the lag
has stayed under them for ``recover_after`` (``for``, at least ``RECOVER_MIN``): a lag hovering
at its threshold wrote a breach and its end every round, 24 audit entries and webhook events
in two minutes (issue 41.7). Meanwhile the breach is ``recovering``, and never resets.

One policy never stops another's: ``decide_all`` reports a policy whose evaluation raises as
``error`` on its own supervisor and decides the others (issue 41.1).

The rules, in the order they are checked once a breach has held for ``for``:

* a suspended supervisor (its file, or an operator's override) is not watched and never reset
  by policy (checked again inside the reset transaction, under the supervisor's lock);
* ``action: alert`` never changes anything (status, metrics and webhook events only);
* a breach whose token is handled was acted on already;
* no automatic reset while the backfill of the previous policy-made reset still runs,
  nor within ``cooldown`` of that reset;
* an observation older than ``STALE_AFTER``, or made before the supervisor's epoch moved,
  is not acted on: the observer looks again first. The request carries the epoch its
  observation saw, and the reset transaction applies it only at that epoch (under the
  supervisor's lock): another reset that landed after the plan was read (a marker earlier in
  the same pass, an operator's ``reconciler reset``) leaves it unapplied and unhandled.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from reconciler.control.actual import ActualState, State, SupervisorRecord
from reconciler.control.requests import ResetRequest, fit_token
from reconciler.model import MAX_DURATION_TEXT, LagPolicy, Position

STALE_AFTER = 300.0  # seconds: an older observation is not acted on (the observer has stopped)
RECOVER_MIN = 60.0  # seconds an announced breach stays under the thresholds before it ends, at least
RESET_ACTION = "resetToLatestAndBackfill"


@dataclass(frozen=True)
class LagObservation:
    """The last lag observation of one supervisor with a lag policy (persisted by the observer)."""

    supervisor_id: str
    observed_at: datetime
    epoch: int  # the supervisor's epoch when observed: a reset since makes it stale
    records: int | None  # records not yet ingested, across partitions (None: unknown)
    seconds: float | None  # age of the oldest record not yet ingested, the partitions' maximum
    breach_since: datetime | None = None  # start of the current breach; the policy token derives from it
    fired_at: datetime | None = None  # when the breach had held for ``for`` (announced once)
    # Since when an announced breach has been under the thresholds. Kept by the observer in
    # memory, not stored: a new leader counts afresh, so its end comes later, never twice.
    under_since: datetime | None = None


@dataclass(frozen=True)
class LagState:
    """What the planner needs to decide on one supervisor's policy."""

    observation: LagObservation | None = None
    last_reset_at: datetime | None = None  # the last reset a policy made
    last_backfill: str | None = None  # and its backfill supervisor


class PolicyStatus(enum.StrEnum):
    UNOBSERVED = "unobserved"  # no observation yet (no daemon leads, or it just started)
    OK = "ok"  # under the thresholds
    PENDING = "pending"  # breached, not yet for ``for``
    DUE = "due"  # the next pass resets
    ALERT = "alert"  # breached for ``for``; action alert: nothing changes
    APPLIED = "applied"  # this breach's reset is done
    SUSPENDED = "suspended"  # breached, but a suspended supervisor is never reset by policy
    BACKFILL_RUNNING = "backfill-running"  # the previous policy-made backfill still runs
    COOLING = "cooling"  # within the cooldown of the previous policy-made reset
    STALE = "stale"  # the observation is too old, or from before a reset: observe again first
    RECOVERING = "recovering"  # an announced breach back under the thresholds, not yet for long enough
    ERROR = "error"  # the policy could not be evaluated (the other supervisors' are, all the same)


@dataclass(frozen=True)
class PolicyDecision:
    supervisor_id: str
    policy: LagPolicy
    status: PolicyStatus
    message: str
    observation: LagObservation | None = None
    request: ResetRequest | None = None  # with DUE and action resetToLatestAndBackfill

    def to_dict(self) -> dict[str, Any]:
        o = self.observation
        return {
            "supervisor": self.supervisor_id, "policy": dict(self.policy.document), "status": str(self.status),
            "message": self.message,
            "observed": None if o is None else {
                "at": o.observed_at.isoformat(), "records": o.records, "seconds": o.seconds,
                "breachSince": o.breach_since.isoformat() if o.breach_since else None},
            "token": self.request.token if self.request else None,
        }


def breaches(policy: LagPolicy, records: int | None, seconds: float | None) -> list[str]:
    """What is over the thresholds, e.g. ``["98,000 records > 20,000", "1.4h > 1h"]``; an unknown
    value breaches nothing (a broker that does not answer is not a lag)."""
    out = []
    if policy.max_records is not None and records is not None and records > policy.max_records:
        out.append(f"{records:,} records > {policy.max_records:,}")
    if policy.max_lag is not None and seconds is not None and seconds > policy.max_lag:
        out.append(f"{human_seconds(seconds)} > {policy.document.get('maxLag') or human_seconds(policy.max_lag)}")
    return out


def below(policy: LagPolicy, records: int | None, seconds: float | None) -> bool:
    """Known to be under every threshold: the end of a breach (unknown values end nothing)."""
    if policy.max_records is not None and (records is None or records > policy.max_records):
        return False
    if policy.max_lag is not None and (seconds is None or seconds > policy.max_lag):
        return False
    return True


def recover_after(policy: LagPolicy) -> float:
    """Seconds an announced breach must stay under the thresholds to end."""
    return max(policy.for_seconds, RECOVER_MIN)


def policy_token(supervisor_id: str, breach_since: datetime) -> str:
    """``policy:<id>:<breach start, UTC, to the microsecond>`` (PostgreSQL hands times back in the
    session's zone: the token is of the instant, whatever the zone it is read in)."""
    return fit_token(f"policy:{supervisor_id}:{breach_since.astimezone(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}")


def reset_reason(policy: LagPolicy, observation: LagObservation) -> str:
    """The audit log's reason: ``lag policy: 1.4h > 1h``."""
    over = breaches(policy, observation.records, observation.seconds)
    return "lag policy: " + (" and ".join(over) if over else "breached")


def policy_request(supervisor_id: str, policy: LagPolicy, observation: LagObservation) -> ResetRequest:
    since = observation.breach_since
    assert since is not None
    return ResetRequest(
        supervisor_id=supervisor_id, token=policy_token(supervisor_id, since), trigger="policy",
        source=f"lag policy breach since {since.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z", position=Position("latest"), backfill=True,
        backfill_task_count=policy.backfill_task_count, reason=reset_reason(policy, observation),
        epoch=observation.epoch)


@dataclass(frozen=True)
class BreachEvent:
    """A breach that held for ``for`` (``lag-breach``), or one that ended (``lag-breach-end``):
    audited by the observer (actor ``policy``), and so sent to the webhook."""

    action: str
    reason: str
    details: Mapping[str, Any]


def advance(policy: LagPolicy, old: LagObservation | None, *, supervisor_id: str, epoch: int,
            records: int | None, seconds: float | None, now: datetime) -> tuple[LagObservation, list[BreachEvent]]:
    """The next observation of one supervisor from the last one: a breach starts at the first
    observation over a threshold and keeps that start while it lasts (the token derives from
    it); it ends when the epoch moved (a reset since: a breach after it is a new one), or when
    the lag is known to be under every threshold: at once if the breach was not announced yet,
    else once it has stayed under for ``recover_after``. An unknown value changes nothing."""
    same = old is not None and old.epoch == epoch
    since, fired, under = (old.breach_since, old.fired_at, old.under_since) if same else (None, None, None)
    events: list[BreachEvent] = []
    over = breaches(policy, records, seconds)
    details = {"records": records, "seconds": seconds, "policy": dict(policy.document)}
    if over:
        since, under = since or now, None
        if fired is None and (now - since).total_seconds() >= policy.for_seconds:
            fired = now
            held = f" (held {human_seconds((now - since).total_seconds())})" if policy.for_seconds else ""
            events.append(BreachEvent("lag-breach", "lag policy: " + " and ".join(over) + held,
                                      details | {"since": since.isoformat(), "action": policy.action}))
    elif below(policy, records, seconds):
        under = under or now
        if fired is not None and (now - under).total_seconds() < recover_after(policy):
            return LagObservation(supervisor_id, now, epoch, records, seconds, since, fired, under), events
        if fired is not None:
            events.append(BreachEvent("lag-breach-end", f"lag back within the policy ({_lag_text_of(records, seconds)})",
                                      details | {"since": since.isoformat() if since else None}))
        since = fired = under = None
    return LagObservation(supervisor_id, now, epoch, records, seconds, since, fired, under), events


def decide(rec: SupervisorRecord, policy: LagPolicy, state: LagState | None, actual: ActualState, now: datetime,
           *, suspended: bool) -> PolicyDecision:
    """The policy's status for one main supervisor, with the reset request when one is due."""
    sid = rec.id
    state = state or LagState()
    o = state.observation

    def decision(status: PolicyStatus, message: str, request: ResetRequest | None = None) -> PolicyDecision:
        return PolicyDecision(sid, policy, status, message, o, request)

    if suspended:
        return decision(PolicyStatus.SUSPENDED, "suspended: lag not watched, never reset by policy")
    if o is None:
        return decision(PolicyStatus.UNOBSERVED, "lag not observed yet (a leading daemon observes it)")
    lag = _lag_text(o)
    if o.breach_since is None:
        return decision(PolicyStatus.OK, f"lag {lag}: within the policy")
    held = (now - o.breach_since).total_seconds()
    over = ", ".join(breaches(policy, o.records, o.seconds)) or "breached"
    since = f"{o.breach_since.astimezone(UTC):%H:%M:%S}Z"
    if o.fired_at is not None and below(policy, o.records, o.seconds):
        return decision(PolicyStatus.RECOVERING, f"lag {lag}: back within the policy; the breach since {since} "
                                                 f"ends once it stays there for {human_seconds(recover_after(policy))}")
    if held < policy.for_seconds:
        act = "reset to latest with a backfill" if policy.action == RESET_ACTION else "alert"
        at = (o.breach_since + timedelta(seconds=policy.for_seconds)).astimezone(UTC)
        return decision(PolicyStatus.PENDING, f"{over} since {since}; if it holds until {at:%H:%M:%S}Z: {act}")
    if policy.action != RESET_ACTION:
        return decision(PolicyStatus.ALERT, f"{over} since {since} (alert only: nothing is changed)")
    request = policy_request(sid, policy, o)
    if request.token in actual.handled_tokens:
        return decision(PolicyStatus.APPLIED, f"{over} since {since}; reset by policy already ({request.token})")
    backfill = actual.supervisors.get(state.last_backfill) if state.last_backfill else None
    if backfill is not None and backfill.state not in (State.COMPLETED, State.TERMINATED):
        return decision(PolicyStatus.BACKFILL_RUNNING,
                        f"{over} since {since}; no reset while the policy's backfill {backfill.id} runs")
    if state.last_reset_at is not None and (now - state.last_reset_at).total_seconds() < policy.cooldown:
        until = (state.last_reset_at + timedelta(seconds=policy.cooldown)).astimezone(UTC)
        return decision(PolicyStatus.COOLING, f"{over} since {since}; cooldown until {until:%Y-%m-%d %H:%M:%S}Z")
    age = (now - o.observed_at).total_seconds()
    if o.epoch != rec.epoch or age > STALE_AFTER:
        why = "the supervisor was reset since" if o.epoch != rec.epoch else f"observed {age:.0f}s ago"
        return decision(PolicyStatus.STALE, f"{over} since {since}; {why}: observed again before acting")
    return decision(PolicyStatus.DUE, f"{over} since {since}: the next pass resets to latest with a backfill", request)


def decide_all(specs: Mapping[str, tuple[Any, bool]], actual: ActualState, lag: Mapping[str, LagState],
               now: datetime) -> list[PolicyDecision]:
    """``specs``: supervisor id -> (its spec, whether it is suspended) for the mains that run.
    A policy whose evaluation raises is reported as ``error`` on its supervisor, with no request:
    the others are decided all the same (issue 29's rule for a pass, issue 41.1)."""
    out = []
    for sid, (spec, suspended) in sorted(specs.items()):
        rec = actual.supervisors.get(sid)
        if spec.lag_policy is None or rec is None or rec.state == State.TERMINATED:
            continue
        state = lag.get(sid)
        try:
            out.append(decide(rec, spec.lag_policy, state, actual, now,
                              suspended=suspended or rec.state == State.SUSPENDED))
        except Exception as exc:  # noqa: BLE001 - one policy's surprise must not stop the pass of every other
            out.append(PolicyDecision(sid, spec.lag_policy, PolicyStatus.ERROR,
                                      f"cannot evaluate the lag policy: {type(exc).__name__}: {exc}; "
                                      f"check its durations (at most {MAX_DURATION_TEXT}) with `reconciler validate`",
                                      state.observation if state else None))
    return out


def human_seconds(seconds: float) -> str:
    """``5040`` -> ``1.4h``; ``90`` -> ``1.5m``; ``42`` -> ``42s``."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds >= 60:
        return f"{seconds / 60:.1f}m"
    return f"{seconds:.0f}s"


def _lag_text(o: LagObservation) -> str:
    return _lag_text_of(o.records, o.seconds)


def _lag_text_of(records: int | None, seconds: float | None) -> str:
    return (f"{'?' if records is None else f'{records:,}'} records, "
            f"{'?' if seconds is None else human_seconds(seconds)}")
