"""The leader's lag observer: lag in records and in time, every ``interval`` seconds, for every
supervisor that runs or is suspended; the input of the lag policies, the metrics and the status
page's charts.

Suspended supervisors are observed too (issue 46.2): during an incident their lag is what an
operator watches grow, and a chart that forgot the suspension after the resume hid the burst
that caused it. They cost little: their checkpoint does not move, so after the first round only
the latest offsets are asked. Their lag policies are not evaluated (a suspended supervisor's
breach ends, as before).

Why a thread of its own rather than the runtimes' own look at positions: a runtime looks
when it cuts a batch, and a supervisor far behind is exactly the one whose batches are long;
a policy's ``for`` must be measured while they run. Each round:

1. reads the supervisors and checkpoints (one transaction) and, for each that runs, asks its
   stream for the latest offsets (a backfill's target is its end offsets) and the timestamp of
   the record at each checkpoint that is behind (``streams.lagtime``: at most one fetch per
   partition), all supervisors at once on a small pool, each broker call bounded by
   ``LAG_TIMEOUT`` as ``reconciler status`` is: a stream that does not answer is unknown,
   never 0, and ends no breach; so is a main supervisor held UNHEALTHY because its source
   started over below the checkpoint (``status.lag_unknown``: the new records there are not
   read, whatever latest minus checkpoint says): its samples are gaps, its history before kept. A record's timestamp never changes, so a checkpoint that has
   not moved since the last round is not asked again (measured: ``benchmarks/lag_observe.py``);
2. for each supervisor with a ``lagPolicy``, advances its breach (``control.lagpolicy.advance``)
   and writes the observations with the audit entries of breaches that held for ``for`` or
   ended, in one transaction; the breach start is persisted because the policy's reset token
   derives from it. It rings the reconcile pass when a policy's reset is due (the plan decides,
   with the same rules, and applies it like a marker's reset). A policy whose evaluation
   raises is logged for its supervisor (once while it lasts) and the others go on (issue 41.1);
3. audits each backfill's progress milestones (25, 50, 75 %) once;
4. keeps the last hour per supervisor (``Sample``: the lag and the records ingested so far, from
   ``batch_totals``, whose differences are the records-per-second chart) in memory and in the
   database (``store.samples``: one batched insert per round that also prunes what is older than
   an hour), so a restarted daemon or a new leader loads them in its first round and the charts
   go on (issue 46.1); sets ``reconciler_lag_seconds`` and the record lag gauges (removed for a
   stream that did not answer: unknown, not its last value).

A backfill's chart begins at its creation, from the database: its whole range behind and nothing
ingested (``_origin``), whenever the observer first meets it, running or completed. Its first
observation is not its start: a fast backfill was first seen after it had read everything (at lag
0, with all it ingested), or only once it had completed, and charted "lag max 0, ingested 0"
beside a row saying 60,000 records (issue 46.2). A completed backfill's samples are kept,
unobserved, until an hour old, ended by one sample at lag 0 with all it ingested.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from reconciler import faults
from reconciler.control.actual import ActualState, Kind, State, SupervisorRecord
from reconciler.control.lagpolicy import LagObservation, LagState, PolicyStatus, advance, decide
from reconciler.errors import ReconcilerError
from reconciler.observe.status import lag_unknown
from reconciler.runtime.supervisor import RUNNABLE
from reconciler.store.freshness import MILESTONES, AuditNote
from reconciler.store.samples import LagSample
from reconciler.store.store import Store
from reconciler.streams import adapter_for
from reconciler.streams.lagtime import behind, lag_seconds, max_seconds, record_times

log = logging.getLogger(__name__)

LAG_TIMEOUT = 1.0  # seconds each broker call may take (as ``reconciler status``)
HISTORY = 3600.0  # seconds of samples kept per supervisor for the charts
_THREADS = 16
OBSERVED = (*RUNNABLE, State.SUSPENDED)  # the states whose lag is observed (and charted)


class Sample(NamedTuple):
    """One round's sample of one supervisor, as the charts read it."""

    at: datetime
    records: int | None  # lag in records (None: unknown)
    seconds: float | None  # lag in time
    ingested: int | None  # records ingested so far (batch_totals); None before the first batch is known


@dataclass(frozen=True)
class PartitionLag:
    partition: str
    checkpoint: int | None
    target: int | None  # latest (main) or end (backfill)
    records: int | None
    seconds: float | None


@dataclass(frozen=True)
class SupervisorLag:
    """One observation of one supervisor."""

    supervisor_id: str
    at: datetime
    partitions: tuple[PartitionLag, ...] = ()
    error: str | None = None  # the stream could not be asked
    unknown: str | None = None  # why the lag cannot be told though the stream answered (``status.lag_unknown``)

    @property
    def records(self) -> int | None:
        values = [p.records for p in self.partitions]
        return None if self.error or self.unknown or None in values else sum(values)

    @property
    def seconds(self) -> float | None:
        if self.error or self.unknown:
            return None
        return max_seconds({p.partition: p.seconds for p in self.partitions})


@dataclass
class _Seen:
    """What the observer keeps per supervisor between rounds."""

    adapter: Any = None
    spec_hash: str | None = None
    samples: deque = field(default_factory=deque)  # Sample
    milestones: set[int] | None = None
    times: dict[str, tuple[int, int]] = field(default_factory=dict)  # partition -> (checkpoint, record time)
    under_since: datetime | None = None  # an announced breach under its thresholds since (not stored)
    policy_error: str | None = None  # the last failure of its policy, logged once while it lasts
    finished: bool = False  # a completed backfill's last sample (lag 0, all it ingested) is taken


class LagObserver:
    """``start()`` / ``stop()``; ``observe_once()`` is one round (tests call it directly).
    ``on_due`` is rung when a policy's reset is due (the daemon's next pass applies it)."""

    def __init__(self, store: Store, *, interval: float, metrics: Any = None,
                 on_due: Callable[[], None] | None = None, clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.store = store
        self.interval = interval
        self.metrics = metrics
        self.on_due = on_due
        self.clock = clock
        self.latest: dict[str, SupervisorLag] = {}
        self._seen: dict[str, _Seen] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._close_on_exit = False
        self._loaded = False  # the stored samples read (a new leader's first round)
        self._unsaved: list[LagSample] = []  # this round's samples, written at its end

    # -- the thread ----------------------------------------------------------------------

    def start(self) -> None:
        if self.interval <= 0 or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="lag-observer", daemon=True)
        self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        """``wait=False`` (a deposed leader): the round under way ends on its own, unwaited, and
        the thread closes its clients as it leaves."""
        thread, self._thread = self._thread, None
        self._close_on_exit = not wait
        self._stop.set()
        if thread is not None and wait:
            thread.join(timeout=30)
            for seen in self._seen.values():
                _close(seen)
            self._seen.clear()
            self._loaded = False

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.observe_once()
            except ReconcilerError as exc:  # the database is away: observe again next round
                log.warning("lag observation skipped: %s", exc)
            except Exception:  # noqa: BLE001 - a bug must not end the observer
                log.exception("lag observation failed")
            self._stop.wait(max(0.05, self.interval - (time.monotonic() - started)))
        if self._close_on_exit:  # stopped without waiting: the clients are closed here
            for seen in self._seen.values():
                _close(seen)

    # -- one round -----------------------------------------------------------------------

    def observe_once(self) -> list[SupervisorLag]:
        # the records ingested from the moment of the checkpoints: read after the brokers were asked,
        # a publish in between gave a sample the next batch's records beside the lag before it
        with self.store.snapshot():
            actual = self.store.read_actual()
            totals = self.store.all_batch_totals()
        now = self.clock()
        if not self._loaded:
            self._load(actual, now)
        watched = {sid: r for sid, r in actual.supervisors.items() if r.state in OBSERVED}
        finished = []
        for gone in set(self._seen) - set(watched):
            rec = actual.supervisors.get(gone)
            seen = self._seen[gone]
            _close(seen)
            # a completed backfill's chart keeps its run until it is an hour old; terminated, it goes
            if rec is None or rec.state != State.COMPLETED or not seen.samples or \
                    (now - seen.samples[-1].at).total_seconds() > HISTORY:
                self._seen.pop(gone)
            elif not seen.finished:
                finished.append(gone)
        for sid, rec in actual.supervisors.items():
            # a backfill met for the first time, running or (ran between two rounds, or before this
            # leader) completed: its chart begins at its creation, not at this first look
            done = rec.state == State.COMPLETED and rec.updated_at is not None \
                and (now - rec.updated_at).total_seconds() <= HISTORY
            if rec.bounded and sid not in self._seen and (sid in watched or done):
                origin = _origin(rec, now, _range_age(rec))
                if origin is None and done:
                    continue
                self._seen[sid] = _Seen()
                if origin is not None:
                    self._add(sid, origin)
                if done:
                    finished.append(sid)
        recs = sorted(watched.values(), key=lambda r: r.id)
        found: list[SupervisorLag] = []
        if recs:
            with ThreadPoolExecutor(max_workers=min(_THREADS, len(recs)), thread_name_prefix="lag") as pool:
                found = list(pool.map(lambda r: self._observe(r, actual.checkpoints.get(r.id, {}), now), recs))
        with self._lock:
            self.latest = {o.supervisor_id: o for o in found}
        for o in found:
            t = totals.get(o.supervisor_id)
            self._remember(o, t.records if t is not None else 0)
        for sid in finished:
            # its range is done: the charts end at lag 0 with what its last batches ingested, not at
            # the lag seen before them (the table says 0; a chart saying "now 59,257" contradicted it)
            t, seen = totals.get(sid), self._seen[sid]
            ended = actual.supervisors[sid].updated_at or now
            at = max(ended, seen.samples[-1].at) if seen.samples else now
            self._remember(SupervisorLag(sid, at, (PartitionLag("", None, None, 0, 0.0),)),
                           t.records if t is not None else 0)
            seen.finished = True
        self._export(found)
        running = {o.supervisor_id: o for o in found if watched[o.supervisor_id].state in RUNNABLE}
        self._policies(actual, running, now)
        self._milestones(actual, now)
        self._save(now)
        return found

    def _observe(self, rec: SupervisorRecord, checkpoint: Mapping[str, int], now: datetime) -> SupervisorLag:
        seen = self._seen.setdefault(rec.id, _Seen())
        try:
            if seen.adapter is None or seen.spec_hash != rec.spec_hash:
                _close(seen)
                seen.adapter, seen.spec_hash = adapter_for(rec.spec.source, timeout=LAG_TIMEOUT), rec.spec_hash
            target = dict(rec.end_offsets) if rec.bounded else seen.adapter.latest()
            if (why := lag_unknown(rec, checkpoint, target)) is not None:
                # a source that started over below the checkpoint: latest minus checkpoint (0, or a
                # few) would chart a supervisor that reads nothing as caught up; a gap, not a 0
                return SupervisorLag(rec.id, now, tuple(PartitionLag(p, checkpoint.get(p), end, None, None)
                                                        for p, end in sorted(target.items(),
                                                                             key=lambda kv: _order(kv[0]))),
                                     unknown=why)
            times = self._times(seen, checkpoint, target)
        except ReconcilerError as exc:
            _close(seen)
            return SupervisorLag(rec.id, now, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - an untranslated client error: unknown, not fatal
            _close(seen)
            return SupervisorLag(rec.id, now, error=f"{type(exc).__name__}: {exc}")
        seconds = lag_seconds(checkpoint, target, times, int(now.timestamp() * 1000))
        parts = tuple(PartitionLag(p, checkpoint.get(p), end,
                                   max(0, end - checkpoint[p]) if p in checkpoint else None, seconds[p])
                      for p, end in sorted(target.items(), key=lambda kv: _order(kv[0])))
        return SupervisorLag(rec.id, now, parts)

    @staticmethod
    def _times(seen: _Seen, checkpoint: Mapping[str, int], target: Mapping[str, int]) -> dict[str, int | None]:
        """The record times at the checkpoints that are behind. A record's timestamp never
        changes, so a checkpoint that has not moved since the last round is not asked again:
        a supervisor stuck behind (a broken batch, a suspended backfill) costs no fetch."""
        lagging = behind(checkpoint, target)
        known = {p: ts for p, (offset, ts) in seen.times.items() if lagging.get(p) == offset}
        asked = {p: cp for p, cp in lagging.items() if p not in known}
        fetched = record_times(seen.adapter, asked, target) if asked else {}
        seen.times = {p: (lagging[p], ts) for p, ts in (known | fetched).items() if ts is not None}
        return known | fetched

    def _remember(self, o: SupervisorLag, ingested: int | None) -> None:
        self._add(o.supervisor_id, Sample(o.at, o.records, o.seconds, ingested))

    def _add(self, sid: str, sample: Sample) -> None:
        seen = self._seen.get(sid)
        if seen is None:
            return
        with self._lock:
            seen.samples.append(sample)
            while seen.samples and (sample.at - seen.samples[0][0]).total_seconds() > HISTORY:
                seen.samples.popleft()
        self._unsaved.append(LagSample(sid, *sample))

    # -- the samples kept in the database --------------------------------------------------

    def _load(self, actual: ActualState, now: datetime) -> None:
        """The samples the last leader (or this daemon before its restart) wrote: the charts go on."""
        stored = self.store.lag_samples(now - timedelta(seconds=HISTORY))
        with self._lock:
            for sid, rows in stored.items():
                rec = actual.supervisors.get(sid)
                if rec is None or sid in self._seen:
                    continue
                samples = deque(Sample(r.at, r.records, r.seconds, r.ingested) for r in rows)
                # sampled after it completed: its last sample is taken; else it is added this round
                ended = rec.state == State.COMPLETED and rec.updated_at is not None and samples[-1].at >= rec.updated_at
                self._seen[sid] = _Seen(samples=samples, finished=ended)
        self._loaded = True

    def _save(self, now: datetime) -> None:
        """This round's samples in one insert, with the prune. Those a database that was away did
        not take are written with the next round's, while they are within the hour."""
        keep_since = now - timedelta(seconds=HISTORY)
        unsaved = [s for s in self._unsaved if s.at >= keep_since]
        if unsaved:
            self.store.save_lag_samples(unsaved, keep_since=keep_since)
        self._unsaved = []

    def history(self, supervisor_id: str) -> list[Sample]:
        """The last hour's samples of one supervisor, oldest first."""
        with self._lock:
            seen = self._seen.get(supervisor_id)
            return list(seen.samples) if seen else []

    def snapshot(self) -> dict[str, SupervisorLag]:
        with self._lock:
            return dict(self.latest)

    # -- lag policies ------------------------------------------------------------------------

    def _policies(self, actual: ActualState, found: Mapping[str, SupervisorLag], now: datetime) -> None:
        states = self.store.lag_states()
        rows: list[LagObservation] = []
        notes: list[AuditNote] = []
        keep: set[str] = set()
        for sid, rec in actual.mains().items():
            policy = _policy(rec)
            o = found.get(sid)
            if policy is None or o is None:
                continue
            keep.add(sid)
            old = states.get(sid).observation if sid in states else None
            seen = self._seen.setdefault(sid, _Seen())
            try:
                new, events = advance(policy, replace(old, under_since=seen.under_since) if old else None,
                                      supervisor_id=sid, epoch=rec.epoch, records=o.records, seconds=o.seconds, now=now)
            except Exception as exc:  # noqa: BLE001 - one policy's surprise must not end the round of every other
                self._policy_failed(seen, sid, exc)
                continue
            seen.under_since = new.under_since
            rows.append(new)
            notes += [AuditNote(sid, e.action, "policy", e.reason, e.details, "lag policy") for e in events]
            if self.metrics is not None:
                self.metrics.set_breach(sid, new.fired_at is not None)
        forget = [sid for sid in states if states[sid].observation is not None and sid not in keep]
        for sid in forget:  # suspended, terminated, or the policy removed: its breach ends here
            old = states[sid].observation
            if old.fired_at is not None:
                notes.append(AuditNote(sid, "lag-breach-end", "policy", "no longer watched (suspended, terminated, "
                                       "or its lagPolicy removed)", {"since": old.breach_since.isoformat()
                                                                      if old.breach_since else None}, "lag policy"))
            if self.metrics is not None:
                self.metrics.set_breach(sid, None)
        if rows or notes or forget:
            self.store.save_lag(rows, notes, forget, now=now)
        for new in rows:  # a breach just recorded: the point a crash must neither repeat nor lose
            old = states.get(new.supervisor_id)
            if new.breach_since is not None and (old is None or old.observation is None
                                                 or old.observation.breach_since != new.breach_since):
                faults.crash_point("after-breach", new.supervisor_id)
        due = []
        for new in rows:
            rec = actual.supervisors[new.supervisor_id]
            state = states.get(new.supervisor_id)
            lag_state = replace(state, observation=new) if state is not None else LagState(observation=new)
            seen = self._seen.setdefault(rec.id, _Seen())
            try:
                d = decide(rec, _policy(rec), lag_state, actual, now, suspended=rec.suspended)
            except Exception as exc:  # noqa: BLE001 - as above: the others are still rung for
                self._policy_failed(seen, rec.id, exc)
                continue
            seen.policy_error = None
            if d.status == PolicyStatus.DUE:
                due.append(d.supervisor_id)
        if due and self.on_due is not None:
            log.info("lag policy breached long enough: %s; reconciling now", ", ".join(due))
            self.on_due()

    @staticmethod
    def _policy_failed(seen: _Seen, sid: str, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if error != seen.policy_error:  # every round would repeat it: said once while it lasts
            log.error("lag policy of %s cannot be evaluated: %s; skipped, the other supervisors' policies go on",
                      sid, error, extra={"supervisor": sid})
        seen.policy_error = error

    # -- backfill milestones -------------------------------------------------------------------

    def _milestones(self, actual: ActualState, now: datetime) -> None:
        backfills = {sid: r for sid, r in actual.supervisors.items()
                     if r.kind == Kind.BACKFILL and r.state in RUNNABLE and sid in self._seen}
        unknown = [sid for sid in backfills if self._seen[sid].milestones is None]
        if unknown:
            for sid, done in self.store.backfill_milestones(unknown).items():
                self._seen[sid].milestones = done
        for sid, rec in backfills.items():
            start, end = rec.start_offsets or {}, rec.end_offsets or {}
            cp = actual.checkpoints.get(sid, {})
            total = sum(end[p] - start.get(p, end[p]) for p in end)
            done = sum(min(cp.get(p, start.get(p, 0)), end[p]) - start.get(p, end[p]) for p in end)
            if total <= 0:
                continue
            if done >= total:  # its completion is audited (COMPLETED): "75 % ingested" of a done range understated it
                self._seen[sid].milestones.update(MILESTONES)
                continue
            pct = 100.0 * done / total
            reached = [m for m in MILESTONES if pct >= m and m not in self._seen[sid].milestones]
            if reached:  # one entry for the highest passed: a fast backfill does not flood the log
                m = max(reached)
                self.store.record_milestone(sid, m, {"done": done, "total": total, "parent": rec.parent_id}, now=now)
                self._seen[sid].milestones.update(reached)

    # -- metrics ---------------------------------------------------------------------------------

    def _export(self, found: list[SupervisorLag]) -> None:
        if self.metrics is None:
            return
        for o in found:
            if o.error:  # the broker did not answer: unknown, not the last value seen
                self.metrics.forget_lag(o.supervisor_id)
                continue
            self.metrics.observe_lag(o.supervisor_id, {p.partition: (p.checkpoint, p.target, p.seconds)
                                                       for p in o.partitions}, unknown=o.unknown is not None)
        self.metrics.prune_lag({o.supervisor_id for o in found})


def _policy(rec: SupervisorRecord):
    try:
        return rec.spec.lag_policy
    except Exception:  # noqa: BLE001 - a stored spec of an older version: no policy rather than a crash
        return None


def _origin(rec: SupervisorRecord, now: datetime, seconds: float | None = None) -> Sample | None:
    """A backfill at its creation: its whole range behind, nothing ingested (its id is new), the
    oldest record of its range ``seconds`` old (``_range_age``)."""
    if not rec.bounded or rec.created_at is None or rec.created_at > now:
        return None
    start = rec.start_offsets or {}
    behind = sum(max(0, e - start.get(p, e)) for p, e in (rec.end_offsets or {}).items())
    return Sample(rec.created_at, behind, seconds if behind else 0.0, 0)


def _range_age(rec: SupervisorRecord) -> float | None:
    """How long the oldest record of a backfill's range had waited when the backfill was made: its
    lag in time at its creation, what the main's chart showed at the reset. Without it, a backfill
    that ran between two rounds charted "max 0s" (its only other sample is its end, at 0). Asked
    once per backfill, bounded as a round's lookups; unknown (None) when the stream cannot say."""
    if not rec.bounded or rec.created_at is None:
        return None
    start, end = rec.start_offsets or {}, dict(rec.end_offsets or {})
    try:
        adapter = adapter_for(rec.spec.source, timeout=LAG_TIMEOUT)
        try:
            times = record_times(adapter, {p: start[p] for p in end if p in start}, end)
        finally:
            adapter.close()
    except Exception as exc:  # noqa: BLE001 - the chart's first point is unknown, the round goes on
        log.debug("the age of %s's range is unknown: %s", rec.id, exc)
        return None
    stamps = [t for t in times.values() if t is not None]
    if not stamps:
        return None
    return max(0.0, rec.created_at.timestamp() - min(stamps) / 1000.0)


def _close(seen: _Seen) -> None:
    seen.times = {}
    if seen.adapter is not None:
        try:
            seen.adapter.close()
        except Exception:  # noqa: BLE001 - closing a broken client must not stop the round
            log.debug("adapter close failed", exc_info=True)
        seen.adapter = None


def _order(p: str):
    return (0, int(p), "") if p.isdigit() else (1, 0, p)
