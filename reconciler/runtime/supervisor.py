"""One supervisor's runtime: a step cuts a batch, ingests it through Spark, publishes.

A step reads the supervisor row (epoch) BEFORE its checkpoints, so a reset landing
in between can only make the epoch stale, never the checkpoint: the publish then
loses its compare-and-swap and the staged output is discarded. That ordering is
what makes every reset and every concurrent publisher exactly-once.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler import faults
from reconciler.control.actual import DetailedState, State, SupervisorRecord
from reconciler.control.positions import start_offsets
from reconciler.errors import PermanentError, PublishConflict, RetryableError
from reconciler.pipeline.formats import FILE_KEYS, FormatUnavailable
from reconciler.pipeline.spark import SparkMisconfigured, SparkUnavailable
from reconciler.pipeline.worker_errors import product_message
from reconciler.runtime import truncation
from reconciler.runtime.batching import batch_budget, batch_tasks, caught_up, cut_ranges
from reconciler.runtime.outage import Outage
from reconciler.runtime.publishing import BatchInTable, ResetUnderway
from reconciler.runtime.sourceguard import SourceGuard
from reconciler.store.store import SegmentFile, Store, TableConflict
from reconciler.streams import adapter_for
from reconciler.table.writeids import new_write_id

log = logging.getLogger(__name__)

UNHEALTHY_AFTER = 3  # consecutive failures before a supervisor is reported UNHEALTHY_*
MAX_BACKOFF = 60.0
RETENTION_CHECK_EVERY = 60.0  # seconds between asking for earliest offsets while all is well
RUNNABLE = (State.PENDING, State.RUNNING, State.IDLE, State.UNHEALTHY_SUPERVISOR, State.UNHEALTHY_TASKS)


class SpecChanged(Exception):
    """Another spec was applied while a batch ran: it is not published."""


@dataclass
class RuntimeContext:
    store: Store
    segments_dir: Path | str  # the warehouse: a directory, or s3://bucket/prefix
    spark: Callable[[], Any]  # lazily started SparkSession: the tick never waits on Spark
    lease: Callable[[], tuple[str, int] | None] = lambda: None
    metrics: Any = None  # reconciler.observe.metrics.Metrics, or None
    job: Any = None  # the batch job (runtime.jobs.BatchJob): Spark's, unless a test brings its own
    adapters: Callable[[Any], Any] = adapter_for  # source -> stream adapter (streams.adapter_for)
    snapshots_kept: int = 25  # settings.snapshotsKept: the publish expires the snapshots beyond
    reader_grace: float = 600.0  # settings.readerGrace: what a commit unreferences goes this much later
    catalog: dict = field(default_factory=dict)  # settings.catalog: empty is the metadata database's
    _tables: Any = field(default=None, repr=False)
    _publisher: Any = field(default=None, repr=False)
    _tables_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def batch_job(self):
        if self.job is None:
            from reconciler.runtime.jobs import SparkJob

            self.job = SparkJob(self.spark)
        return self.job

    def tables(self):
        """The output tables' catalog (``reconciler.table.catalog.Tables``), opened once."""
        with self._tables_lock:
            if self._tables is None:
                from reconciler.table.catalogs import open_tables

                self._tables = open_tables(self.store.engine, self.segments_dir, self.catalog,
                                           snapshots_kept=self.snapshots_kept, reader_grace=self.reader_grace)
            return self._tables

    def publisher(self):
        """The commit protocol of the tables' catalog (``runtime.publishing``), chosen once."""
        if self._publisher is None:
            if getattr(self.tables(), "PROTOCOL", "sql") == "external":
                from reconciler.runtime.publish_external import ExternalPublish as Publish
            else:
                from reconciler.runtime.publish_sql import SqlPublish as Publish
            self._publisher = Publish(self)
        return self._publisher


@dataclass
class StepOutcome:
    delay: float  # seconds until this runtime should step again
    records: int = 0
    done: bool = False  # bounded supervisor completed, or no longer runnable
    # The delay counts from when the step started, not from when it ended: batches are cut
    # every taskDuration (a fixed cadence), so a record waits for the next cut, not for
    # the cut plus the time the last batch took to read and publish.
    cadence: bool = False


@dataclass
class SupervisorRuntime:
    supervisor_id: str
    ctx: RuntimeContext
    failures: int = 0
    recent_errors: deque = field(default_factory=lambda: deque(maxlen=10))
    _adapter: Any = None
    _adapter_hash: str | None = None
    _reported: tuple | None = None
    _retention_checked: float = 0.0
    _guard: SourceGuard | None = None  # is this still the source the checkpoints were taken on
    _schemas: tuple | None = None  # (spec hash, row schema, dead-letter schema)
    _record_bytes: float | None = None  # mean key + value bytes of the records read so far
    _head: Any = None  # what the commit protocol learnt before the checkpoints were read (its fence)
    _outage: Outage = field(default_factory=lambda: Outage(log))

    def reconsider(self) -> None:
        """The spec or the epoch changed: forget past failures and look at retention again."""
        self.failures = 0
        self._outage.reconsidered()
        self._retention_checked = 0.0

    def step(self) -> StepOutcome:
        rec = self.ctx.store.get(self.supervisor_id)
        if rec is None or rec.state not in RUNNABLE:
            self.close()
            return StepOutcome(0.0, done=True)
        spec = rec.spec
        try:
            return self._ingest(rec, spec)
        except truncation.SourceChanged as exc:  # nothing published: the next step finds the restart
            log.warning("%s", exc, extra={"supervisor": rec.id})
            return StepOutcome(0.0)
        except SpecChanged as exc:  # nothing published: the next step reads the range under the new spec
            log.info("%s", exc, extra={"supervisor": rec.id})
            return StepOutcome(0.0)
        except ResetUnderway as exc:  # nothing read: the reset finishes, then its epoch reads on
            log.log(logging.WARNING if exc.stalled else logging.INFO, "%s", exc, extra={"supervisor": rec.id})
            if exc.stalled:  # held longer than a step: a reset that failed or crashed after its fence
                self._report(rec, rec.state, DetailedState.UNHEALTHY_SUPERVISOR, str(exc))
            return StepOutcome(1.0)
        except PublishConflict as exc:
            log.info("publish conflict: %s", exc, extra={"supervisor": rec.id})
            return StepOutcome(0.0)
        except TableConflict as exc:  # the table kept moving under publish_sql.PUBLISH_ATTEMPTS stagings
            log.warning("%s; the batch is read again", exc, extra={"supervisor": rec.id})
            return StepOutcome(0.5)
        except (SparkUnavailable, SparkMisconfigured) as exc:  # the cluster, not the stream: no traceback
            return self._failed(rec, DetailedState.UNHEALTHY_TASKS, State.UNHEALTHY_TASKS, exc)
        except FormatUnavailable as exc:  # the schema registry, not the stream: records wait
            return self._failed(rec, DetailedState.UNHEALTHY_SUPERVISOR, State.UNHEALTHY_SUPERVISOR, exc)
        except RetryableError as exc:
            return self._failed(rec, DetailedState.LOST_CONTACT_WITH_STREAM, State.UNHEALTHY_SUPERVISOR, exc)
        except PermanentError as exc:
            return self._failed(rec, DetailedState.UNABLE_TO_CONNECT_TO_STREAM, State.UNHEALTHY_SUPERVISOR, exc)
        except Exception as exc:  # a Spark job failed: the batch is lost, not its records
            worker = product_message(exc)
            if worker is not None and worker.kind == "unavailable":  # a task's registry was down
                return self._failed(rec, DetailedState.UNHEALTHY_SUPERVISOR, State.UNHEALTHY_SUPERVISOR, exc)
            log.exception("batch failed", extra={"supervisor": rec.id})
            return self._failed(rec, DetailedState.UNHEALTHY_TASKS, State.UNHEALTHY_TASKS, exc)

    def _ingest(self, rec: SupervisorRecord, spec) -> StepOutcome:
        captured = time.monotonic()
        adapter = self._adapter_for(rec)
        # After the epoch (``rec``), before the checkpoints: an external catalog's fence is read here.
        self._head = self.ctx.publisher().prepare(rec, spec.data_schema.datasource)
        checkpoint = self.ctx.store.checkpoints(rec.id)
        if rec.bounded:
            target = dict(rec.end_offsets)
            gone = self._backfill_source_gone(rec, spec, adapter, checkpoint, target)
            if gone:
                return gone
        else:
            target = adapter.latest()
            checkpoint = self._init_checkpoints(rec, spec, adapter, checkpoint, target)
            restarted = self._source_restarted(rec, spec, adapter, checkpoint, target)
            if restarted:
                return restarted
        if self.ctx.metrics:
            self.ctx.metrics.observe_positions(rec.id, checkpoint, target)
        if caught_up(checkpoint, target):
            if rec.bounded:
                self.ctx.store.set_state(rec.id, State.COMPLETED, DetailedState.COMPLETED, actor="reconciler",
                                         reason="every partition reached its end offset")
                log.info("backfill completed", extra={"supervisor": rec.id})
                self.close()
                return StepOutcome(0.0, done=True)
            self._report(rec, State.IDLE, DetailedState.IDLE, None)
            self._outage.ended(rec.id, self.failures)
            self.failures = 0
            return StepOutcome(spec.task_duration, cadence=True)
        checkpoint, blocked = self._past_retention(rec, spec, adapter, checkpoint, target)
        if blocked:
            return blocked
        ranges = cut_ranges(checkpoint, target,
                            batch_budget(spec.max_batch_records, spec.max_batch_bytes, self._record_bytes))
        self._report(rec, State.RUNNING, DetailedState.RUNNING, None)
        records = self._run_batch(rec, spec, ranges, capture=time.monotonic() - captured)
        self._outage.ended(rec.id, self.failures)
        self.failures = 0
        more = not caught_up({r.partition: r.end for r in ranges} | {
            p: o for p, o in checkpoint.items() if p not in {r.partition for r in ranges}}, target)
        return StepOutcome(0.0 if more else spec.task_duration, records=records, cadence=True)

    def _init_checkpoints(self, rec, spec, adapter, checkpoint, latest):
        missing = set(latest) - set(checkpoint)
        if not missing:
            return checkpoint
        self._report(rec, State.PENDING if rec.state == State.PENDING else rec.state,
                     DetailedState.DISCOVERING_INITIAL_TASKS, None)
        now = datetime.now(UTC)
        # First start: startFrom. Partitions added later start at earliest: none of their records is lost.
        offsets = start_offsets(adapter, spec, now, latest=latest) if not checkpoint else adapter.earliest()
        return self.ctx.store.init_checkpoints(rec.id, {p: offsets[p] for p in missing if p in offsets})

    def _source_restarted(self, rec, spec, adapter, checkpoint, target) -> StepOutcome | None:
        """A topic deleted and created again, or a partition truncated below its checkpoint
        (``runtime.sourceguard``): handled like retention loss, before anything is called caught
        up. With ``onRetentionLoss: continue`` the new records are read from the new earliest
        offset in a new source generation; by default UNHEALTHY with the way out."""
        found = self._source_guard().check(rec, adapter, checkpoint, target)
        if found is None:
            return None
        if found.moves and spec.on_retention_loss != "continue":
            return self._unhealthy(rec, found.unhealthy_message(rec.id))
        generation = self.ctx.store.restart_source(rec.id, rec.epoch, found.moves, identity=found.identity,
                                                   previous=found.previous, reason=found.reason, actor="reconciler",
                                                   dropped=found.dropped)
        self._source_guard().restarted(rec, generation, found.identity)
        self._retention_checked = 0.0
        log.warning("%s (source generation %d)", found.reason, generation, extra={"supervisor": rec.id})
        return StepOutcome(0.0)  # the record is read again: the next batch carries the new generation

    def _backfill_source_gone(self, rec, spec, adapter, checkpoint, target) -> StepOutcome | None:
        """A backfill whose source started over can never read its range (those offsets name
        records of the new source, which the main supervisor reads from its earliest offset).
        With ``onRetentionLoss: continue`` it ends with the unread range recorded as lost;
        by default it turns UNHEALTHY with the reason and the way out."""
        lost = {p: (c, target[p]) for p, c in checkpoint.items() if p in target and c < target[p]}
        if not lost:  # nothing left to read: it completes
            return None
        why = self._source_guard().backfill_gone(rec, adapter)
        if why is None:
            return None
        ranges = ", ".join(f"{p}: [{s}, {e})" for p, (s, e) in sorted(lost.items()))
        main = self.ctx.store.get(rec.parent_id) if rec.parent_id else None
        if (main.spec if main is not None else spec).on_retention_loss != "continue":  # the main's policy now
            return self._unhealthy(rec, f"{why}: this backfill's unread range ({ranges}) belongs to the old source "
                                        f"and can never be read. `reconciler backfill cancel {rec.id}` ends it "
                                        "(the range recorded as lost), or set `onRetentionLoss: continue` in the "
                                        "spec to do so by itself")
        reason = f"{why}: the backfill's unread range ({ranges}) belonged to the old source, lost"
        self.ctx.store.end_backfill_lost(rec.id, rec.epoch, lost, reason=reason, actor="reconciler")
        if self.ctx.metrics:
            self.ctx.metrics.records_lost(rec.id, sum(e - s for s, e in lost.values()))
        log.warning("%s", reason, extra={"supervisor": rec.id})
        return StepOutcome(0.0)  # caught up now: the next step completes it

    def _unhealthy(self, rec, message: str) -> StepOutcome:
        self.failures = max(self.failures, UNHEALTHY_AFTER)
        self._report(rec, State.UNHEALTHY_SUPERVISOR, DetailedState.UNHEALTHY_SUPERVISOR, message)
        log.error("%s", message, extra={"supervisor": rec.id})
        return StepOutcome(MAX_BACKOFF)

    def _source_guard(self) -> SourceGuard:
        if self._guard is None:
            self._guard = SourceGuard(self.ctx.store, RETENTION_CHECK_EVERY)
        return self._guard

    def _confirm_source(self, rec) -> None:
        """Between a batch's read and its publish (``SourceGuard.confirm``)."""
        self._source_guard().confirm(rec, self._adapter_for(rec))

    def _past_retention(self, rec, spec, adapter, checkpoint, target):
        """A checkpoint behind the broker's retention can never be read: say so, never retry it.

        Asked after a failure (a read past retention fails) and once a minute otherwise. A
        backfill, or a main supervisor with ``onRetentionLoss: continue``, moves past the
        deleted range and records the loss; a main supervisor by default turns UNHEALTHY with
        the count and the way out."""
        due = self.failures > 0 or time.monotonic() - self._retention_checked >= RETENTION_CHECK_EVERY
        if not due:
            return checkpoint, None
        earliest = adapter.earliest()
        self._retention_checked = time.monotonic()
        lost = {p: (c, min(earliest[p], target.get(p, earliest[p]))) for p, c in checkpoint.items()
                if p in earliest and c < earliest[p] and c < target.get(p, c)}
        if not lost:
            return checkpoint, None
        count = sum(e - s for s, e in lost.values())
        ranges = ", ".join(f"{p}: [{s}, {e})" for p, (s, e) in sorted(lost.items()))
        if rec.bounded or spec.on_retention_loss == "continue":
            self.ctx.store.skip_lost(rec.id, rec.epoch, lost, actor="reconciler")
            if self.ctx.metrics:
                self.ctx.metrics.records_lost(rec.id, count)
            log.warning("%d records deleted by retention before they were ingested, lost (%s); continuing "
                        "from the earliest offset", count, ranges, extra={"supervisor": rec.id})
            return checkpoint | {p: e for p, (_, e) in lost.items()}, None
        to = json.dumps({p: e for p, (_, e) in sorted(lost.items())})
        message = (f"checkpoint behind the broker's retention: {count} records were deleted before they were "
                   f"ingested ({ranges}). Nothing is read until you choose: `reconciler reset {rec.id} --to "
                   f"'{to}'` (the loss is recorded), or set `onRetentionLoss: continue` in the spec")
        return checkpoint, self._unhealthy(rec, message)

    def _run_batch(self, rec: SupervisorRecord, spec, ranges, capture: float = 0.0) -> int:
        from reconciler.table.catalog import deadletter_table

        ds = spec.data_schema
        batch_id = new_write_id()
        started = time.monotonic()
        records = sum(r.size for r in ranges)
        job = self.ctx.batch_job()
        tables = self.ctx.tables()
        if self._schemas is None or self._schemas[0] != rec.spec_hash:
            # analysis only, but it is the session's first call: a lost cluster shows here
            self._schemas = (rec.spec_hash, *job.schemas(ds))
        _, schema, dead_schema = self._schemas
        table = tables.ensure(ds.datasource, schema, ds.segment_granularity, rollup=ds.rollup)
        dead_name = deadletter_table(ds.datasource)
        dead_table = tables.ensure(dead_name, dead_schema, None)
        data_dir, dead_dir = tables.data_dir(table, batch_id), tables.data_dir(dead_table, batch_id)
        # Recorded before any file exists: no clean-up deletes a file this batch may still
        # commit, and a batch whose files a clean-up took can no longer commit (store/writes.py).
        self.ctx.store.begin_write(batch_id, "batch", tables=[ds.datasource, dead_name], supervisor_id=rec.id)
        planned = time.monotonic()
        faults.point("write-begun", rec.id)
        # Sub-ranges, not partitions, are the unit of parallelism: exactly once does not depend
        # on how they are cut, since the publish commits the whole batch (every task's files
        # and the checkpoints at the ranges' ends) or nothing.
        tasks = batch_tasks(ranges, spec.task_count, bounded=rec.bounded)
        try:
            # a format's schema file is relative to the spec's directory (only those formats
            # take it: other jobs, the explorer's, know nothing of it)
            extra: dict[str, Any] = {"spec_dir": self._spec_dir(rec)} if ds.format in FILE_KEYS else {}
            if ds.schema_discovery:  # the table's types decide a discovered column's
                extra["table_schema"] = table.schema().as_arrow()
            written = job.run(spec, ranges, batch_id, data_dir=data_dir, dead_dir=dead_dir, task_count=tasks,
                              **extra)
        except Exception:  # a failed job's partial output must not linger
            self._abandon(batch_id, (ds.datasource, dead_name), (data_dir, dead_dir))
            raise
        faults.crash_point("after-write", rec.id)
        job_done = time.monotonic()
        try:
            self._same_spec(rec)
            self._confirm_source(rec)
            # schemaDiscovery: the batch's own columns, which the publish evolves the table to
            self._publish(rec, spec, ranges, written, getattr(written, "schema", None) or schema, dead_schema,
                          records)
        except BatchInTable:  # the table may hold the batch: its files stay, the next step rolls forward
            raise
        except Exception:  # lost, fenced, or the database went away mid-commit: the fence decides
            self._abandon(batch_id, (ds.datasource, dead_name), (data_dir, dead_dir))
            raise
        faults.crash_point("after-commit", rec.id)
        if written.input_rows and written.input_bytes is not None:
            mean = written.input_bytes / written.input_rows
            # weighted toward the latest batch: record sizes drift with the producers
            self._record_bytes = mean if self._record_bytes is None else 0.3 * self._record_bytes + 0.7 * mean
        done = time.monotonic()
        elapsed = done - started
        # capture + plan + publish is the batch's fixed cost; the job is Spark's read and write
        phases = {"capture": capture, "plan": planned - started, "job": job_done - planned,
                  "publish": done - job_done}
        if self.ctx.metrics:
            self.ctx.metrics.batch_done(rec.id, records, written.dead_rows, elapsed, phases)
        log.info("batch %s published: %d records (%d unparseable) in %.2fs (capture %.3fs, plan %.3fs, "
                 "job %.2fs, publish %.3fs)", batch_id[:12], records, written.dead_rows, elapsed,
                 capture, phases["plan"], phases["job"], phases["publish"],
                 extra={"supervisor": rec.id, "batch": batch_id, "phases": phases})
        return records

    def _same_spec(self, rec: SupervisorRecord) -> None:
        """A spec applied while the batch ran (a daemon's first pass after its runtimes
        started, a change while a batch was in flight) may read other columns: the batch is
        dropped and its range read again under the new spec."""
        now = self.ctx.store.get(rec.id)
        if now is not None and now.spec_hash != rec.spec_hash:
            raise SpecChanged(f"spec {now.spec_hash[:12]} applied while the batch ran under "
                              f"{rec.spec_hash[:12]}: the batch is read again under it")

    def _spec_dir(self, rec: SupervisorRecord) -> str | None:
        """The directory of the spec file (a backfill's: its main's)."""
        path = rec.spec_path
        if path is None and rec.parent_id:
            parent = self.ctx.store.get(rec.parent_id)
            path = parent.spec_path if parent is not None else None
        return os.path.dirname(os.path.abspath(path)) if path else None

    def _abandon(self, batch_id: str, table_names, dirs) -> None:
        """Delete a batch's files, but only after fencing it (``Store.fence_write``): a batch
        whose commit outcome is unknown is either committed (the fence says so and its files
        stay) or can never commit any more. When the database cannot be asked now, the
        files are left to the next leader's recovery."""
        from reconciler.pipeline import segments

        faults.point("abandon", batch_id)
        try:
            if not self.ctx.store.fence_write(batch_id):
                log.info("batch %s committed after all: its files stay", batch_id[:12])
                return
            segments.discard(*dirs)
            tables = self.ctx.tables()
            for name in table_names:
                tables.storage.delete(tables.write_metadata_files(name, batch_id))
        except Exception:  # noqa: BLE001 - still unreachable: recovery fences and deletes them
            log.warning("batch %s left for recovery", batch_id[:12], exc_info=True)

    def _publish(self, rec, spec, ranges, written, schema, dead_schema, records: int) -> None:
        """The batch's snapshot summary, then the catalog's commit protocol (``publish_sql``:
        one transaction; ``publish_external``: the table, then the database)."""
        from reconciler.table.catalog import (
            BATCH,
            DATASOURCE,
            EPOCH,
            GENERATION,
            RANGES,
            READ,
            RECORDS,
            ROLLUP_PROPERTY,
            SUPERVISOR,
            UNPARSEABLE,
        )

        ds = spec.data_schema
        summary = {SUPERVISOR: rec.id, BATCH: written.batch_id, EPOCH: str(rec.epoch), DATASOURCE: ds.datasource,
                   RANGES: json.dumps([[r.partition, r.start, r.end] for r in ranges]),
                   RECORDS: str(records), UNPARSEABLE: str(written.dead_rows)}
        files = [_segment_file(f, ds.segment_granularity) for f in written.files]
        summary[ROLLUP_PROPERTY] = str(ds.rollup).lower()
        if rec.generation:
            summary[GENERATION] = str(rec.generation)
        read_counts = written.read_counts
        if read_counts is not None:  # verify --deep tells a missing record from an offset without one
            summary[READ] = json.dumps(dict(sorted(read_counts.items())), separators=(",", ":"))
        self.ctx.publisher().publish(rec, ds, written, summary, files, schema, dead_schema, ranges, records,
                                     head=self._head)

    def _failed(self, rec, detailed: DetailedState, unhealthy: State, exc: Exception) -> StepOutcome:
        self.failures += 1
        worker = product_message(exc)  # status shows what the reader said; the log keeps Spark's wrapper
        message = worker.message if worker else f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
        if isinstance(self.ctx.segments_dir, str) and "://" in self.ctx.segments_dir:
            from reconciler.table.storage import unreachable_reason

            message = unreachable_reason(exc) or message  # the store's words, not a traceback
        self.recent_errors.append({"at": datetime.now(UTC).isoformat(timespec="seconds"), "error": message[:500]})
        state = unhealthy if self.failures >= UNHEALTHY_AFTER else rec.state if rec.state != State.PENDING else State.PENDING
        self._report(rec, state, detailed, message[:2000])
        self._drop_adapter()
        delay = min(MAX_BACKOFF, 0.5 * 2 ** min(self.failures, 8))
        self._outage.failed(rec.id, message, self.failures, delay)  # a WARNING once per outage, not per retry
        return StepOutcome(delay)

    def _report(self, rec: SupervisorRecord, state: State, detailed: DetailedState, error: str | None) -> None:
        if self.ctx.metrics:
            self.ctx.metrics.set_failing(rec.id, error)
        now = (state, detailed, error)
        if now == self._reported and rec.state == state:
            return
        self.ctx.store.set_detailed(rec.id, state, detailed, error)
        self._reported = now

    def _adapter_for(self, rec: SupervisorRecord):
        if self._adapter is None or self._adapter_hash != rec.spec_hash:
            self._drop_adapter()
            self._adapter = self.ctx.adapters(rec.spec.source)
            self._adapter_hash = rec.spec_hash
        return self._adapter

    def _drop_adapter(self) -> None:
        if self._adapter is not None:
            try:
                self._adapter.close()
            except Exception:  # closing a broken client must not hide the original error
                log.debug("adapter close failed", exc_info=True)
        self._adapter = None

    def close(self) -> None:
        self._drop_adapter()


def _segment_file(f, granularity: str) -> SegmentFile:
    """A written data file as the store's ``segments`` row (its chunk's interval, UTC)."""
    from reconciler.pipeline.transform import chunk_interval

    start, end = chunk_interval(f.segment, granularity) if f.segment else (None, None)
    return SegmentFile(f.segment or "", _iso(start), _iso(end), f.path, f.rows, f.bytes)


def _iso(t) -> str:
    return t.isoformat().replace("+00:00", "Z") if t else ""
