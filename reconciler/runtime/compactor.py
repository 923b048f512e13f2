"""Periodic compaction of closed time partitions, run by the leader beside the runtimes.

``RuntimeManager`` calls ``maybe_run(now)`` from its loop (cheap: a clock check); when a
run is due it starts one background thread that compacts every datasource the
supervisors write (``reconciler.table.compact.compact``, rollup per the main spec),
then optionally expires snapshots and removes orphans. Compaction commits with the same
compare-and-swap as the publish, so batches keep publishing meanwhile (whoever moves the
table second is re-planned or re-staged). ``stop()`` cancels between partitions: what a
cancelled run wrote is deleted, nothing half-committed is left.

It also runs the rolling compaction of the partitions still being written
(``reconciler.table.rolling``) every ``rolling_every`` seconds, and sooner: every
``ROLLING_CHECK`` seconds it reads each table's live file count from its current snapshot
(one pointer query; the metadata is cached) and runs at once where ``TRIGGER_FILES`` files
arrived since its last run, so the open partition stays near 100 files at any commit rate.

Each datasource's compaction is on its own: one that fails (a corrupt file, a full disk, a
catalog out of reach) is logged with its datasource and counted (``failures``), and the
run goes on with the next datasource and the maintenance due, instead of leaving them all
to the next run, where the same datasource would fail first again.

``configure`` changes the intervals, the lateness and the retention of a running compactor
(SIGHUP): a run is due ``every`` seconds after the last one started, whatever ``every`` was
then, so a shorter interval brings the next run forward and a longer one puts it off; a run
under way finishes with the values it started with.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

log = logging.getLogger(__name__)

ROLLING_CHECK = 5.0  # seconds between looks at the tables' file counts (rolling compaction)


class Compactor:
    def __init__(self, ctx, *, every: float = 3600.0, lateness: float = 3600.0,
                 target_file_size: int | None = None, maintain_every: float = 0.0,
                 snapshot_retention: float = 7 * 86400.0, rolling_every: float = 0.0,
                 first_delay: float = 60.0, clock: Callable[[], float] = time.monotonic):
        """``every`` seconds between compaction runs (0 disables); ``lateness`` seconds after
        its end a time partition counts as closed; ``maintain_every`` seconds between
        snapshot expiry (snapshots older than ``snapshot_retention`` seconds, at least the
        last 100 kept) + orphan clean-up (files older than a day) runs (0: never here, leave
        it to ``reconciler maintain``); ``rolling_every`` seconds between rolling compactions
        of the open partitions (0 disables); the first run comes ``first_delay`` after start."""
        self.ctx = ctx
        self.target_file_size = target_file_size
        self._clock = clock
        self._started = clock()
        self._first_delay = first_delay
        # When the last run of each kind started; None before the first. The next due time is
        # derived from it and the current interval, so configure() only swaps values.
        self._last_compact: float | None = None
        self._last_maintain: float | None = None
        self._last_rolling: float | None = None
        self._last_check = clock()
        self._rolled_files: dict[str, int] = {}  # datasource -> live files right after its last rolling run
        self.rolling_every = rolling_every
        self.rolling_cpu = 0.0  # CPU seconds of the rolling runs and looks (their thread's), since start
        self.rolling_runs = 0
        self.configure(every=every, lateness=lateness, maintain_every=maintain_every,
                       snapshot_retention=snapshot_retention)
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_results: list = []
        self.last_maintenance: list = []
        self.last_error: str | None = None
        self.failures = 0  # datasources whose compaction (hourly or rolling) raised, since start
        self._errors: list[str] = []  # this run's, per datasource

    def configure(self, *, every: float, lateness: float, maintain_every: float,
                  snapshot_retention: float, rolling_every: float | None = None) -> None:
        """New intervals, lateness and retention (the settings' ``compactInterval``,
        ``compactLateness``, ``maintainInterval``, ``snapshotRetention`` and
        ``rollingCompaction``; None keeps the last), from the next run on. Plain attribute
        writes: the manager's thread reads each whole."""
        if rolling_every is not None:
            self.rolling_every = rolling_every
        self.every = every
        self.lateness = timedelta(seconds=lateness)
        self.maintain_every = maintain_every
        self.snapshot_retention = timedelta(seconds=snapshot_retention)

    def next_runs(self) -> tuple[float, float]:
        """When compaction and maintenance are next due (clock time; inf when disabled)."""
        every, maintain_every = self.every, self.maintain_every
        if every > 0:
            compact = (self._last_compact + every if self._last_compact is not None
                       else self._started + min(self._first_delay, every))
        else:
            compact = float("inf")
        if maintain_every > 0:
            maintain = (self._last_maintain + maintain_every if self._last_maintain is not None
                        else self._started + max(self._first_delay, maintain_every))
        else:
            maintain = float("inf")
        return compact, maintain

    def next_rolling(self) -> float:
        """When the rolling compaction is next due by its interval (inf when disabled)."""
        every = self.rolling_every
        if every <= 0:
            return float("inf")
        if self._last_rolling is None:
            return self._started + min(self._first_delay, every)
        return self._last_rolling + every

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def maybe_run(self, now: float | None = None) -> bool:
        """Start a run in the background when one is due and none is running."""
        now = self._clock() if now is None else now
        if self.running or self._cancel.is_set():
            return False
        next_compact, next_maintain = self.next_runs()
        compact_due, maintain_due = now >= next_compact, now >= next_maintain
        rolling_due = now >= self.next_rolling()
        check_due = self.rolling_every > 0 and now >= self._last_check + ROLLING_CHECK
        if not (compact_due or maintain_due or rolling_due or check_due):
            return False
        if compact_due:
            self._last_compact = now
        if maintain_due:
            self._last_maintain = now
        if rolling_due:
            self._last_rolling = now
        if rolling_due or check_due:
            self._last_check = now
        self._thread = threading.Thread(target=self._run, args=(compact_due, maintain_due, rolling_due, check_due),
                                        name="compactor", daemon=True)
        self._thread.start()
        return True

    def stop(self, timeout: float | None = 30.0) -> None:
        self._cancel.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, compact_due: bool, maintain_due: bool, rolling_due: bool = False,
             check_due: bool = False) -> None:
        self._errors = []
        try:
            if compact_due:
                self.last_results = self.run_once()
            if (rolling_due or check_due) and not self._cancel.is_set():
                self.roll_once(force=rolling_due)
            if maintain_due and not self._cancel.is_set():
                self.last_maintenance = self.maintain_once()
            self.last_error = "; ".join(self._errors) or None
        except Exception as exc:  # the database or disk: try again next time, never kill the daemon
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("table maintenance failed (retried in the next run): %s", exc, exc_info=True)

    def datasources(self) -> dict[str, object]:
        """Datasource -> its rollup (None without), from the supervisors' specs (main first):
        the metrics of all of them (``Rollup.of_all``)."""
        from reconciler.table.compact import Rollup

        by_datasource: dict[str, list] = {}
        records = sorted(self.ctx.store.read_actual().supervisors.values(), key=lambda r: r.kind != "main")
        for r in records:
            by_datasource.setdefault(r.spec.data_schema.datasource, []).append(r.spec.data_schema)
        return {ds: Rollup.of_all(schemas) for ds, schemas in by_datasource.items()}

    def run_once(self) -> list:
        from reconciler.table.compact import DEFAULT_TARGET_FILE_SIZE, compact

        tables = self.ctx.tables()
        lateness = self.lateness  # read once: a SIGHUP during the run applies to the next one
        results = []
        for name, rollup in sorted(self.datasources().items()):
            if self._cancel.is_set():
                break
            try:
                if tables.load(name) is None:
                    continue
                result = compact(tables, name, store=self.ctx.store, rollup=rollup, lateness=lateness,
                                 target_file_size=self.target_file_size or DEFAULT_TARGET_FILE_SIZE,
                                 cancel=self._cancel)
            except Exception as exc:
                self._failed("compaction", name, exc)
                continue
            results.append(result)
            if result.partitions and not result.committed and not self._cancel.is_set():
                log.warning("compaction of %s: %s", name, result.message)
        return results

    def roll_once(self, force: bool = True) -> list:
        """The rolling compaction of every datasource's open partitions; without ``force``
        (a check between two due runs) only of those with ``TRIGGER_FILES`` new files."""
        from reconciler.table.compact import DEFAULT_TARGET_FILE_SIZE
        from reconciler.table.rolling import TRIGGER_FILES, compact_open, live_files

        cpu = time.thread_time()
        tables = self.ctx.tables()
        lateness = self.lateness
        results = []
        for name, rollup in sorted(self.datasources().items()):
            if self._cancel.is_set():
                break
            try:
                if name not in self._rolled_files and tables.load(name) is None:
                    continue
                live = live_files(tables.current(name))
                last = min(self._rolled_files.get(name, 0), live)  # a closed hour's compaction lowers it
                self._rolled_files[name] = last
                if not force and live - last < TRIGGER_FILES:
                    continue
                result = compact_open(tables, name, store=self.ctx.store, rollup=rollup, lateness=lateness,
                                      target_file_size=self.target_file_size or DEFAULT_TARGET_FILE_SIZE,
                                      cancel=self._cancel)
                self._rolled_files[name] = live_files(tables.current(name))
            except Exception as exc:
                self._failed("rolling compaction", name, exc)
                continue
            results.append(result)
            if result.partitions and not result.committed and not self._cancel.is_set():
                log.warning("rolling compaction of %s: %s", name, result.message)
        used = time.thread_time() - cpu
        self.rolling_cpu += used  # the looks that found too few files included: they are its cost too
        if results:
            self.rolling_runs += 1
            log.info("rolling compaction: %s (%.3f CPU-s; %.1f CPU-s in %d runs so far)",
                     "; ".join(f"{r.table}: {r.files_before} file(s) -> {r.files_after}" for r in results),
                     used, self.rolling_cpu, self.rolling_runs)
        return results

    def _failed(self, what: str, datasource: str, exc: Exception) -> None:
        self.failures += 1
        self._errors.append(f"{what} of {datasource}: {type(exc).__name__}: {exc}")
        log.warning("%s of %s failed (retried at the next run; the other datasources go on): %s",
                    what, datasource, exc, exc_info=True)

    def maintain_once(self) -> list:
        from reconciler.table.expire import expire_snapshots
        from reconciler.table.orphans import remove_orphans

        tables = self.ctx.tables()
        retention = self.snapshot_retention  # read once, as run_once reads the lateness
        out = []
        for name in tables.names():
            if self._cancel.is_set():
                break
            out.append(expire_snapshots(tables, name, store=self.ctx.store, older_than=retention))
            out.append(remove_orphans(tables, name, store=self.ctx.store))
        return out
