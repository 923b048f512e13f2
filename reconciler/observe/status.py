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
the lag the daemon observed), and ``lastCommitAt`` the datasource's last commit.

One supervisor never breaks the report of the others: a lookup that raises is that
supervisor's ``streamError``; one that does not answer within ``ASK_DEADLINE`` (a client
stuck in I/O: a thread cannot be stopped) is given up, its thread left behind as a daemon
thread and replaced, so the others are still asked and the command still exits; a record
that cannot be reported is shown with ``statusError``."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from reconciler.control.actual import Kind, State, SupervisorRecord
from reconciler.errors import ReconcilerError
from reconciler.observe import deadletterstatus
from reconciler.runtime.startedover import STARTED_OVER
from reconciler.spec import secrets
from reconciler.store.records import NO_BATCHES, BatchTotals
from reconciler.store.store import Store
from reconciler.streams import adapter_for
from reconciler.streams.lagtime import lag_seconds, max_seconds, record_times

LAG_TIMEOUT = 1.0  # seconds each broker call of a lag lookup may take
ASK_DEADLINE = 10.0  # seconds one supervisor's whole lookup may take before it is given up
_LAG_THREADS = 16


def supervisor_status(store: Store, rec: SupervisorRecord, checkpoint: Mapping[str, int], *,
                      with_latest: bool = True, now: datetime | None = None,
                      positions: tuple | None = None,
                      totals: BatchTotals | None = None, lost: int | None = None,
                      restarts: Mapping[str, int] | None = None) -> dict[str, Any]:
    """``positions``: (latest offsets, stream error[, record times]) already asked for; else asked
    here. ``totals`` and ``lost``: its batch totals and records lost to retention, already read;
    else read here."""
    now = now or datetime.now(UTC)
    latest, stream_error, times = ({}, None, None)
    if positions is None and with_latest and _asks_stream(rec):
        positions = _latest(rec, checkpoint)
    if positions is not None:
        latest, stream_error, times = (*positions, None)[:3]
    unknown = lag_unknown(rec, checkpoint, latest)
    # a completed backfill's range is done: no lag, in records or in time (not "unknown" because
    # its broker is not asked)
    finished = rec.bounded and rec.state == State.COMPLETED
    parts = []
    for p in sorted(set(checkpoint) | set(latest) | set(rec.end_offsets or {}), key=_order):
        cp = checkpoint.get(p)
        end = (rec.end_offsets or {}).get(p)
        target = end if end is not None else latest.get(p)
        lag = 0 if finished else max(0, target - cp) if target is not None and cp is not None and not unknown else None
        parts.append({"partition": p, "checkpoint": cp, "latest": latest.get(p), "end": end, "lag": lag,
                      "lagSeconds": 0.0 if finished else None if unknown
                      else _partition_seconds(p, cp, target, times, now)})
    totals = totals if totals is not None else store.batch_totals(rec.id)
    out: dict[str, Any] = {
        "id": rec.id, "kind": str(rec.kind), "parent": rec.parent_id, "state": str(rec.state),
        "detailedState": str(rec.detailed_state), "epoch": rec.epoch, "specHash": rec.spec_hash,
        "specPath": rec.spec_path, "datasource": rec.spec_document.get("dataSchema", {}).get("datasource"),
        "source": secrets.redact(rec.spec_document.get("source")), "lastError": rec.last_error,
        "specError": rec.spec_error, "runtimeError": rec.runtime_error,
        "lastRequest": rec.last_request, "streamError": stream_error, "partitions": parts,
        "lag": _total_lag(parts, rec.bounded or bool(latest)),
        "lagSeconds": _max_seconds(parts, times is not None or finished),
        "lagUnknown": unknown,
        "records": totals.records, "unparseable": totals.unparseable, "batches": totals.batches,
        "lostRecords": lost if lost is not None else store.lost_records(rec.id),
        # a topic re-created or truncated below the checkpoint (runtime.truncation): in `history`
        "sourceRestarts": (restarts if restarts is not None else store.source_restarts()).get(rec.id, 0),
        "updatedAt": rec.updated_at.isoformat() if rec.updated_at else None,
        "createdAt": rec.created_at.isoformat() if rec.created_at else None,
        "taskDuration": _task_duration(rec),
    }
    if rec.kind == Kind.BACKFILL:
        out["backfill"] = _backfill_progress(rec, checkpoint, totals, now)
    return out




# A runtime keeps the state it had for its first failures (UNHEALTHY_AFTER in a row: one blip
# must not page anyone), recording only the detail and the error; shown beside that error, the
# old state (IDLE, in green) says the opposite of the detail.
_FAILING = {"LOST_CONTACT_WITH_STREAM": "UNHEALTHY_SUPERVISOR", "UNABLE_TO_CONNECT_TO_STREAM": "UNHEALTHY_SUPERVISOR",
            "UNHEALTHY_SUPERVISOR": "UNHEALTHY_SUPERVISOR", "UNHEALTHY_TASKS": "UNHEALTHY_TASKS"}


def settle(item: dict[str, Any], *, live: bool = True, lag: int | None = None) -> dict[str, Any]:
    """The state to show, from what is known now, when the stored one contradicts it.

    The stored state is the runtime's word at its last look. A RUNNING or IDLE supervisor whose
    last step failed is shown UNHEALTHY_* at once (the stored state follows after a few failures
    in a row). An IDLE one with records behind it (``lag``: the lag known now, by default the
    item's own) is shown RUNNING when a daemon leads: its next look, at most ``taskDuration``
    after its last, cuts a batch; that is the window in which the database still says IDLE.
    Without a daemon nothing reads them, and the note says so. What the database holds stays in
    ``stored``; ``stateNote`` says why the two differ."""
    state, detail = item.get("state"), item.get("detailedState")
    if state not in ("RUNNING", "IDLE"):
        return item
    lag = item.get("lag") if lag is None else lag
    shown, note = None, None
    if item.get("lastError") and detail in _FAILING:
        shown = _FAILING[detail]
        note = (f"its last step failed ({detail}, the error beside it); recorded as {state} until it fails "
                "a few times in a row; retried with a back-off")
    elif state == "IDLE" and lag:
        since = f" at {_hhmmss(item['updatedAt'])}" if item.get("updatedAt") else ""
        if live:
            shown = "RUNNING"
            every = item.get("taskDuration")
            within = f"within its taskDuration ({every:g}s) of that look" if every else "at its next look"
            note = (f"{lag:,} record(s) arrived after its last look{since}, which found it caught up (IDLE); "
                    f"the daemon cuts a batch {within}")
        else:
            note = f"{lag:,} record(s) arrived after its last look{since}; no daemon runs to read them"
    if note:
        item["stateNote"] = note
    if shown:
        item["stored"] = {"state": state, "detailedState": detail}
        item["state"] = shown
        if shown == "RUNNING":
            item["detailedState"] = "RUNNING"
    return item


def as_recorded(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` for ``status -o json``: ``state`` and ``detailedState`` as the database records
    them (Druid's meaning, which scripts compare against: UNHEALTHY only after the failures in a
    row the runtime allows), the state the text and the pages show beside them as ``shownState``
    and ``shownDetailedState``, and ``stateNote`` saying why the two differ."""
    stored = item.pop("stored", None)
    if stored is not None:
        item["shownState"], item["shownDetailedState"] = item["state"], item["detailedState"]
        item["state"], item["detailedState"] = stored["state"], stored["detailedState"]
    return item


def _task_duration(rec: SupervisorRecord) -> float | None:
    try:
        return rec.spec.task_duration
    except Exception:  # noqa: BLE001 - an old stored spec: the note does without it
        return None


def _hhmmss(iso: str) -> str:
    when = datetime.fromisoformat(iso)
    return f"{(when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC):%H:%M:%S}Z"


def lag_unknown(rec: SupervisorRecord, checkpoint: Mapping[str, int], latest: Mapping[str, int]) -> str | None:
    """Why the lag cannot be told, or None. A main supervisor held UNHEALTHY because its source
    started over below the checkpoint (a topic re-created, a partition truncated) has records
    there it has not read, however the checkpoint compares with the new end: latest minus
    checkpoint (0, or a few) would say it is caught up while it reads nothing."""
    if rec.kind != Kind.MAIN or rec.state != State.UNHEALTHY_SUPERVISOR:
        return None
    above = sorted((p for p, c in checkpoint.items() if p in latest and c > latest[p]), key=_order)
    if STARTED_OVER not in (rec.runtime_error or "") and not above:
        return None
    where = f" (partition(s) {', '.join(above)}: checkpoint above the stream's end)" if above else ""
    return (f"unknown: the source started over below the checkpoints{where}; the records there are new ones, "
            f"not read yet, and are counted once the way out in the error is taken (`reconciler status {rec.id}`)")


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
        return {}, secrets.scrub(str(exc)), None
    except Exception as exc:  # noqa: BLE001 - one supervisor's surprise is its own error, not the report's
        return {}, secrets.scrub(f"{type(exc).__name__}: {exc}"), None


def _partition_seconds(p: str, cp: int | None, target: int | None, times: Mapping[str, int | None] | None,
                       now: datetime) -> float | None:
    """Unknown (None) without the times or the offsets: never a false 0."""
    if times is None or cp is None or target is None:
        return None
    return lag_seconds({p: cp}, {p: target}, times, int(now.timestamp() * 1000))[p]


def _max_seconds(parts: list[dict[str, Any]], known: bool) -> float | None:
    return max_seconds({x["partition"]: x["lagSeconds"] for x in parts}) if known else None




def ask_all(recs: Sequence[SupervisorRecord], checkpoints: Mapping[str, Mapping[str, int]] | None = None, *,
            workers: int = _LAG_THREADS, deadline: float | None = None) -> dict[str, tuple]:
    """``_latest`` of every record (against its checkpoint in ``checkpoints``) on up to
    ``workers`` threads; a lookup that takes longer than ``deadline`` (default
    ``ASK_DEADLINE``) is given up (reported as such) and its thread replaced."""
    checkpoints = checkpoints or {}
    deadline = ASK_DEADLINE if deadline is None else deadline
    todo: deque[SupervisorRecord] = deque(recs)
    results: dict[str, tuple] = {}
    started: dict[str, float] = {}
    lock = threading.Lock()
    wake = threading.Event()

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                rec = todo.popleft()
                started[rec.id] = time.monotonic()
            answer = _latest(rec, checkpoints.get(rec.id, {}))
            with lock:
                results.setdefault(rec.id, answer)
            wake.set()

    def hire() -> None:
        threading.Thread(target=work, name="lag", daemon=True).start()

    busy = min(workers, len(todo))
    for _ in range(busy):
        hire()
    while True:
        with lock:
            now = time.monotonic()
            late = [sid for sid, t in started.items() if sid not in results and now - t >= deadline]
            for sid in late:  # given up: its thread may never come back, so another takes its place
                results[sid] = ({}, f"no answer from the stream within {deadline:g}s (given up)", None)
            done = len(results) == len(recs)
        if done:
            return results
        for _ in late:
            hire()
        wake.wait(0.1)
        wake.clear()


def all_status(store: Store, supervisor_id: str | None = None, *, with_latest: bool = True,
               live: bool | None = None) -> list[dict[str, Any]]:
    """``live``: whether a daemon leads now (read from the lease when not given): see ``settle``."""
    # the checkpoints and the records ingested from one moment: a publish moves both in one
    # transaction, and read apart they showed lag from before it beside records from after it
    with store.snapshot():
        actual = store.read_actual()
        recs = [r for sid, r in sorted(actual.supervisors.items()) if supervisor_id in (None, sid)]
        if supervisor_id is None:  # one query for all rather than one per supervisor
            totals, lost = store.all_batch_totals(), store.all_lost_records()
        else:
            totals = {r.id: store.batch_totals(r.id) for r in recs}
            lost = {r.id: store.lost_records(r.id) for r in recs}
        restarts = store.source_restarts()
    asked = [r for r in recs if with_latest and _asks_stream(r)]
    positions = ask_all(asked, actual.checkpoints) if asked else {}
    now = datetime.now(UTC)
    items = []
    for r in recs:
        try:
            items.append(supervisor_status(store, r, actual.checkpoints.get(r.id, {}), with_latest=with_latest,
                                           now=now, positions=positions.get(r.id, ({}, None)),
                                           totals=totals.get(r.id, NO_BATCHES), lost=lost.get(r.id, 0),
                                           restarts=restarts))
        except ReconcilerError:
            raise  # the database: the whole report fails, as it must
        except Exception as exc:  # noqa: BLE001 - one record that cannot be reported is shown as such
            items.append(_unreportable(r, exc))
    _freshness(store, actual, items, now)
    deadletterstatus.add(store, items)  # pending dead letters and how to see them (issue 43)
    for item in items:
        override = actual.overrides.get(item["id"])
        item["override"] = None if override is None else {
            "kind": override.kind, "reason": override.reason, "actor": override.actor, "at": override.at.isoformat(),
            "description": override.describe()}
    if live is None:
        lease = store.lease()
        live = bool(lease and lease.live(now))
    for item in items:
        settle(item, live=live)
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
            try:
                d = decide(rec, policy, lag.get(rec.id), actual, now,
                           suspended=rec.suspended or rec.id in actual.overrides or rec.spec.suspended)
            except Exception as exc:  # noqa: BLE001 - one policy that cannot be judged is shown as such
                item["statusError"] = secrets.scrub(f"cannot judge the lag policy: {type(exc).__name__}: {exc}")
                continue
            item["lagPolicy"] = d.to_dict()


def _unreportable(rec: SupervisorRecord, exc: Exception) -> dict[str, Any]:
    """What is known of a supervisor whose report failed, and why (every key a report has)."""
    error = secrets.scrub(f"cannot report: {type(exc).__name__}: {exc}")
    return {"id": rec.id, "kind": str(rec.kind), "parent": rec.parent_id, "state": str(rec.state),
            "detailedState": str(rec.detailed_state), "epoch": rec.epoch, "specHash": rec.spec_hash,
            "specPath": rec.spec_path, "datasource": None, "source": None, "lastError": rec.last_error,
            "specError": rec.spec_error, "runtimeError": rec.runtime_error, "lastRequest": rec.last_request,
            "streamError": error, "statusError": error, "partitions": [], "lag": None, "lagUnknown": None, "records": 0,
            "unparseable": 0, "batches": 0, "lostRecords": 0, "lagSeconds": None,
            "updatedAt": rec.updated_at.isoformat() if rec.updated_at else None}


def _total_lag(parts: list[dict[str, Any]], known: bool) -> int | None:
    """None when the stream's end is unknown (not asked, or unreachable): never a false 0."""
    lags = [x["lag"] for x in parts]
    return sum(lags) if known and None not in lags else None


def _order(p: str):
    return (0, int(p), "") if p.isdigit() else (1, 0, p)


def spark_state(seen: Mapping[str, Any] | None, leader: str | None, daemons: Sequence[str], master: str,
                host: str) -> dict[str, Any]:
    """What ``status`` says of Spark: the running daemon's session, as that daemon recorded it
    (the state directory's ``spark.json``, the same record ``/healthz`` serves), never another
    daemon's and never a gone daemon's "up". ``leader``: the live lease's holder (host:pid:nonce);
    ``daemons``: the live daemons' holders; ``master``: the configured one; ``host``: this host.

    ``daemon`` is the daemon the record is of (None: none runs); ``running``: whether one runs."""
    seen = dict(seen or {})
    running = leader or (daemons[0] if daemons else None)
    base = {"master": seen.get("master") or master, "appId": seen.get("appId"), "state": seen.get("state"),
            "reason": seen.get("reason"), "since": seen.get("since"), "pid": seen.get("pid"),
            "daemon": None, "running": running is not None}
    if running is None:
        if not seen:
            return base | {"state": "not started", "reason": "no daemon is running (`reconciler run` starts Spark)"}
        if seen.get("state") in ("up", "not started"):  # its daemon was killed: nothing stopped the record
            return base | {"state": "stopped", "reason": f"its daemon (pid {seen.get('pid')}) no longer runs"}
        return base
    mine = f"{seen.get('host')}:{seen.get('pid')}:"
    if seen and running.startswith(mine):
        return base | {"daemon": running}
    if running.split(":", 1)[0] != host:
        return base | {"master": master, "appId": None, "state": "unknown", "since": None, "pid": None,
                       "daemon": running, "reason": f"the daemon {running} runs on another host: its /healthz "
                                                   "says how its Spark session is"}
    why = (f"the leader {running} has not started its Spark session yet (it does when a supervisor first runs)"
           if leader else f"no daemon leads now (standby {running}): Spark starts with the leader")
    return base | {"master": master, "appId": None, "state": "not started", "since": None, "pid": None,
                   "daemon": running, "reason": why}
