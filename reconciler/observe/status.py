"""Status reports: what ``reconciler status`` prints and ``/metrics`` exports.

Reads the database first, in a fixed number of queries whatever the number of
supervisors (``status --no-lag`` over a thousand answers within a second), and, unless
told not to, then asks every supervisor's stream for its latest offsets, all at once and
each bounded by ``LAG_TIMEOUT``: during an incident ``status`` must answer in seconds
even when every broker is down. A stream that cannot be reached is reported as such
(``streamError``), never as lag 0. Secrets never appear: specs are redacted.

Lag in time (issue 32): with the latest offsets, the same call asks for the timestamp of the
record at each checkpoint that is behind (``streams.lagtime``: one fetch per partition, same
bound), so each partition has ``lagSeconds`` beside ``lag`` and the supervisor has the
maximum as ``lagSeconds``; ``lagPolicy`` is the policy's status as the planner sees it (from
the lag the daemon observed), and ``lastCommitAt`` the datasource's last commit."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from reconciler.control.actual import Kind, State, SupervisorRecord
from reconciler.errors import ReconcilerError
from reconciler.spec import secrets
from reconciler.store.records import NO_BATCHES, BatchTotals
from reconciler.store.store import Store
from reconciler.streams import adapter_for
from reconciler.streams.lagtime import lag_seconds, max_seconds, record_times

LAG_TIMEOUT = 1.0  # seconds each broker call of a lag lookup may take
_LAG_THREADS = 16


def supervisor_status(store: Store, rec: SupervisorRecord, checkpoint: Mapping[str, int], *,
                      with_latest: bool = True, now: datetime | None = None,
                      positions: tuple | None = None,
                      totals: BatchTotals | None = None, lost: int | None = None) -> dict[str, Any]:
    """``positions``: (latest offsets, stream error[, record times]) already asked for; else asked
    here. ``totals`` and ``lost``: its batch totals and records lost to retention, already read;
    else read here."""
    now = now or datetime.now(UTC)
    latest, stream_error, times = ({}, None, None)
    if positions is None and with_latest and _asks_stream(rec):
        positions = _latest(rec, checkpoint)
    if positions is not None:
        latest, stream_error, times = (*positions, None)[:3]
    parts = []
    for p in sorted(set(checkpoint) | set(latest) | set(rec.end_offsets or {}), key=_order):
        cp = checkpoint.get(p)
        end = (rec.end_offsets or {}).get(p)
        target = end if end is not None else latest.get(p)
        lag = max(0, target - cp) if target is not None and cp is not None else None
        parts.append({"partition": p, "checkpoint": cp, "latest": latest.get(p), "end": end, "lag": lag,
                      "lagSeconds": _partition_seconds(p, cp, target, times, now)})
    totals = totals if totals is not None else store.batch_totals(rec.id)
    out: dict[str, Any] = {
        "id": rec.id, "kind": str(rec.kind), "parent": rec.parent_id, "state": str(rec.state),
        "detailedState": str(rec.detailed_state), "epoch": rec.epoch, "specHash": rec.spec_hash,
        "specPath": rec.spec_path, "datasource": rec.spec_document.get("dataSchema", {}).get("datasource"),
        "source": secrets.redact(rec.spec_document.get("source")), "lastError": rec.last_error,
        "specError": rec.spec_error, "runtimeError": rec.runtime_error,
        "lastRequest": rec.last_request, "streamError": stream_error, "partitions": parts,
        "lag": _total_lag(parts, rec.bounded or bool(latest)),
        "lagSeconds": _max_seconds(parts, times is not None),
        "records": totals.records, "unparseable": totals.unparseable, "batches": totals.batches,
        "lostRecords": lost if lost is not None else store.lost_records(rec.id),
        "updatedAt": rec.updated_at.isoformat() if rec.updated_at else None,
    }
    if rec.kind == Kind.BACKFILL:
        out["backfill"] = _backfill_progress(rec, checkpoint, totals, now)
    return out


def _backfill_progress(rec: SupervisorRecord, checkpoint, totals: BatchTotals, now) -> dict[str, Any]:
    start, end = rec.start_offsets or {}, rec.end_offsets or {}
    total = sum(end[p] - start.get(p, end[p]) for p in end)
    done = sum(min(checkpoint.get(p, start.get(p, 0)), end[p]) - start.get(p, end[p]) for p in end)
    rate = eta = None
    if totals.first is not None and done > 0:
        # a finished backfill keeps the rate it ran at (up to its last batch), not one that decays
        until = totals.last if rec.state == State.COMPLETED and totals.last is not None else now
        elapsed = max((until - rec.created_at).total_seconds(), 1e-3)
        rate = done / elapsed
        eta = (total - done) / rate if rate > 0 else None
    return {"done": done, "total": total, "ratePerSecond": rate, "etaSeconds": eta,
            "complete": rec.state == State.COMPLETED}


def _asks_stream(rec: SupervisorRecord) -> bool:
    return rec.state not in (State.TERMINATED, State.COMPLETED)


def _latest(rec: SupervisorRecord, checkpoint: Mapping[str, int] | None = None
            ) -> tuple[dict[str, int], str | None, dict[str, int | None] | None]:
    """(latest offsets, stream error, record times at the checkpoints that are behind)."""
    try:
        adapter = adapter_for(rec.spec.source, timeout=LAG_TIMEOUT)
        try:
            latest = adapter.latest()
            try:
                times = record_times(adapter, checkpoint or {}, dict(rec.end_offsets) if rec.bounded else latest)
            except ReconcilerError:
                times = {}  # the offsets are known, the times not: lagSeconds unknown, lag in records shown
            return latest, None, times
        finally:
            adapter.close()
    except ReconcilerError as exc:
        return {}, str(exc), None


def _partition_seconds(p: str, cp: int | None, target: int | None, times: Mapping[str, int | None] | None,
                       now: datetime) -> float | None:
    """Unknown (None) without the times or the offsets: never a false 0."""
    if times is None or cp is None or target is None:
        return None
    return lag_seconds({p: cp}, {p: target}, times, int(now.timestamp() * 1000))[p]


def _max_seconds(parts: list[dict[str, Any]], known: bool) -> float | None:
    return max_seconds({x["partition"]: x["lagSeconds"] for x in parts}) if known else None


def all_status(store: Store, supervisor_id: str | None = None, *, with_latest: bool = True) -> list[dict[str, Any]]:
    actual = store.read_actual()
    recs = [r for sid, r in sorted(actual.supervisors.items()) if supervisor_id in (None, sid)]
    asked = [r for r in recs if with_latest and _asks_stream(r)]
    positions: dict[str, tuple] = {}
    if asked:
        with ThreadPoolExecutor(max_workers=min(_LAG_THREADS, len(asked)), thread_name_prefix="lag") as pool:
            found = pool.map(lambda r: _latest(r, actual.checkpoints.get(r.id, {})), asked)
            positions = dict(zip((r.id for r in asked), found, strict=True))
    every = supervisor_id is None  # one query for all rather than one per supervisor
    totals = store.all_batch_totals() if every else {}
    lost = store.all_lost_records() if every else {}
    now = datetime.now(UTC)
    items = [supervisor_status(store, r, actual.checkpoints.get(r.id, {}), with_latest=with_latest, now=now,
                               positions=positions.get(r.id, ({}, None)),
                               totals=totals.get(r.id, NO_BATCHES) if every else None,
                               lost=lost.get(r.id, 0) if every else None)
             for r in recs]
    _freshness(store, actual, items, now)
    for item in items:
        override = actual.overrides.get(item["id"])
        item["override"] = None if override is None else {
            "kind": override.kind, "reason": override.reason, "actor": override.actor, "at": override.at.isoformat(),
            "description": override.describe()}
    return items




def _freshness(store: Store, actual, items: list[dict[str, Any]], now: datetime) -> None:
    """``lagPolicy`` (the policy's status, as the next pass would decide it) and ``lastCommitAt``
    (when the datasource's table last committed a batch) of each item."""
    from reconciler.control.lagpolicy import decide

    lag = store.lag_states()
    commits = store.last_commits()
    for item in items:
        last = commits.get(item.get("datasource"))
        item["lastCommitAt"] = last.isoformat() if last else None
        item["lastCommitAgeSeconds"] = (now - last).total_seconds() if last else None
        rec = actual.supervisors.get(item["id"])
        try:
            policy = rec.spec.lag_policy if rec is not None and rec.kind == Kind.MAIN else None
        except Exception:  # noqa: BLE001 - an old stored spec: no policy to show
            policy = None
        item["lagPolicy"] = None
        if policy is not None and rec.state != State.TERMINATED:
            d = decide(rec, policy, lag.get(rec.id), actual, now,
                       suspended=rec.suspended or rec.id in actual.overrides or rec.spec.suspended)
            item["lagPolicy"] = d.to_dict()


def _total_lag(parts: list[dict[str, Any]], known: bool) -> int | None:
    """None when the stream's end is unknown (not asked, or unreachable): never a false 0."""
    lags = [x["lag"] for x in parts]
    return sum(lags) if known and None not in lags else None


def _order(p: str):
    return (0, int(p), "") if p.isdigit() else (1, 0, p)
