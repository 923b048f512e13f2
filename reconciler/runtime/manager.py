"""Schedules supervisor runtimes on a few threads, beside the daemon's tick; a step that
overstays its time limit gives its thread's place to the others.

The manager re-reads the supervisor table on its own (every ``refresh`` seconds, or at
once when the daemon pokes it after a reconcile), so supervisors created by another
process (``reconciler reset`` generating a backfill) start without a tick. A runtime is
never stepped twice at once. At most ``workers`` steps run at a time, each on its own
thread, the supervisors that have waited longest first.

**The step time limit.** One supervisor's step (a batch: positions, the Spark job, the
publish) may block in I/O that no client timeout bounds: a secret or CA file swapped for a
FIFO under librdkafka, a server that accepts and never answers. A Python thread cannot be
killed, so a step that runs longer than ``step_timeout`` is *abandoned*: the supervisor is
reported UNHEALTHY_SUPERVISOR with how long and where it is stuck (``/healthz`` says so
too), and its place among the ``workers`` goes to a new thread, so the other supervisors
keep their share. The abandoned thread is left to finish on its own; the supervisor is not
stepped again until it has (it stays in ``running``), so threads stay bounded by
``workers`` plus one per stuck supervisor.

Why an abandoned step may still publish, and needs nothing bumped to stay exactly once:
its publish is the usual compare-and-swap, in one transaction, of the checkpoints it read
(C) and the epoch it read (E), under this leadership term's fencing token. While it is
abandoned nothing in this daemon publishes for that supervisor (it is not stepped). If
nothing else moved it either, its late publish is exactly the publish it would have made
on time: ``[C, end)`` read once, committed once with its checkpoints. If anything did (a
reset or a termination bumps E; a batch of another daemon after a lease handover moves C
under another token), the publish loses its compare-and-swap and its files are discarded.
Either way no range is committed twice or skipped, so the only thing to stop is
*scheduling*, which the manager does. The state a late step reports (RUNNING, IDLE) is
corrected by the next step.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from reconciler.control.actual import DetailedState, State
from reconciler.runtime.supervisor import RUNNABLE, RuntimeContext, StepOutcome, SupervisorRuntime

log = logging.getLogger(__name__)

STEP_TIMEOUT = 600.0  # seconds; the stepTimeout setting
# The loop's longest sleep: how soon it notices a step overstaying its limit, the
# compactor's turn, the refresh. A cut due sooner wakes it sooner (``_until_due``).
LOOP_WAIT = 0.05


@dataclass
class _Step:
    """One step in flight: its thread, when it started, and whether its time ran out."""

    thread: threading.Thread
    started: float = field(default_factory=time.monotonic)
    abandoned: bool = False
    finished: threading.Event = field(default_factory=threading.Event)

    def running(self) -> bool:
        return not self.finished.is_set()

    def done(self) -> bool:
        return self.finished.is_set()


class RuntimeManager:
    def __init__(self, ctx: RuntimeContext, *, workers: int = 2, refresh: float = 1.0,
                 compact_every: float = 0.0, compact_lateness: float = 3600.0,
                 maintain_every: float = 0.0, snapshot_retention: float = 3600.0,
                 rolling_every: float = 0.0, on_progress: Callable[[], None] | None = None,
                 step_timeout: float | Callable[[], float] = STEP_TIMEOUT, held_for: float = 0.0):
        from reconciler.runtime.compactor import Compactor

        self.ctx = ctx
        self.compactor = Compactor(ctx, every=compact_every, lateness=compact_lateness,
                                   maintain_every=maintain_every, snapshot_retention=snapshot_retention,
                                   rolling_every=rolling_every)
        self.refresh = refresh
        self.workers = workers
        self._step_timeout = step_timeout if callable(step_timeout) else (lambda: step_timeout)
        self._on_progress = on_progress  # the daemon's bell: a batch or a backfill done may mean caught up
        self.runtimes: dict[str, SupervisorRuntime] = {}
        self.due: dict[str, float] = {}
        self._versions: dict[str, tuple] = {}  # (spec hash, epoch) each runtime last saw
        self.running: dict[str, _Step] = {}  # steps in flight, abandoned ones included
        self._ring_when_idle = False  # someone waits for "no step in flight" (idle_or_notify)
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="runtime-manager", daemon=True)
        self._lock = threading.Lock()
        self._spark_started = False
        self._held_for = held_for
        self._held_until = 0.0

    def start(self) -> None:
        """Start scheduling. With ``held_for``, no step starts until ``open`` is called or that
        many seconds have passed: a new leader's first reconcile pass applies the markers and
        stanzas left while no daemon led, and a batch started beside it would read the backlog
        that a ``resetTo: latest`` was dropped to skip. The bound keeps a pass that never
        concludes (a busy spec directory, a database error) from stopping ingestion."""
        if self._held_for > 0:
            self._held_until = time.monotonic() + self._held_for
        self._thread.start()

    def held(self) -> bool:
        """True while steps wait for the term's first reconcile pass (see ``start``)."""
        return self._held_until > 0

    def open(self) -> None:
        """The term's first reconcile pass has run (or given up): steps may start."""
        if self._held_until:
            self._held_until = 0.0
            self._poke.set()

    def poke(self) -> None:
        """Re-read supervisors now (after a reconcile changed them)."""
        self._poke.set()

    def idle(self) -> bool:
        with self._lock:
            return not self.running

    def idle_or_notify(self) -> bool:
        """True when no step is in flight; else False, and ``on_progress`` rings once when the
        last step in flight ends, whatever it read. ``--until-caught-up`` asks this once the
        targets are reached: the step in flight then is often one that reads nothing (the
        next cut, due at once after a batch longer than ``taskDuration``, or another
        supervisor's), and without the ring the loop would sleep until its next check."""
        with self._lock:
            if not self.running:
                return True
            self._ring_when_idle = True
            return False

    def stuck(self) -> list[str]:
        """Supervisors whose step overstayed its time limit and has not come back."""
        with self._lock:
            return sorted(sid for sid, step in self.running.items() if step.abandoned)

    def stop(self, wait: bool = True) -> None:
        """Stop scheduling; with ``wait``, let in-flight batches finish (publish or be fenced).
        An abandoned step is not waited for: it may never come back."""
        self.compactor.stop()
        self._stop.set()
        self._poke.set()
        if self._thread.is_alive():
            self._thread.join()
        if wait:
            with self._lock:
                steps = [s for s in self.running.values() if not s.abandoned]
            for step in steps:
                step.finished.wait()
        with self._lock:  # a runtime still stepping is closed by _done, not under its feet
            idle = [rt for sid, rt in self.runtimes.items() if sid not in self.running]
        for rt in idle:
            rt.close()

    def _loop(self) -> None:
        last_sync = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            # before the refresh: a batch that ran past its cadence pokes the loop, and its
            # next cut, due at once, need not wait for a read of every supervisor
            self._submit_due(now)
            if self._poke.is_set() or now - last_sync >= self.refresh:
                self._poke.clear()
                try:
                    self._sync()
                except Exception:  # the database is unreachable: keep what we have, try again
                    log.warning("cannot refresh supervisors", exc_info=True)
                last_sync = now
            self._abandon_overdue(now)
            self._submit_due(now)
            self.compactor.maybe_run(now)
            self._poke.wait(self._until_due(time.monotonic()))

    def _until_due(self, now: float) -> float:
        """How long the loop may sleep: until the next cut is due, at most ``LOOP_WAIT``. A
        fixed 50 ms sleep cut a batch due in 10 ms up to 40 ms late: at taskDuration 0.25s,
        a tenth of the cadence added to every record's wait for its batch."""
        with self._lock:
            # one due already is waiting for a free worker (``_submit_due`` ran just now):
            # a step's end frees one, not the clock, so it would only spin the loop
            due = [d for sid in self.runtimes if sid not in self.running and (d := self.due.get(sid, 0.0)) > now]
        return min(LOOP_WAIT, min(due, default=now + LOOP_WAIT) - now)

    def _sync(self) -> None:
        actual = self.ctx.store.read_actual()
        wanted = {sid for sid, r in actual.supervisors.items() if r.state in RUNNABLE}
        with self._lock:
            for sid in wanted - set(self.runtimes):
                self.runtimes[sid] = SupervisorRuntime(sid, self.ctx)
                self.due[sid] = 0.0
            if self.runtimes and not self._spark_started and self.ctx.job is None:  # a test's own job needs none
                self._spark_started = True
                threading.Thread(target=self._start_spark, name="spark-start", daemon=True).start()
            for sid in wanted:
                rec = actual.supervisors[sid]
                version = (rec.spec_hash, rec.epoch)
                # A new spec or a reset is the operator's answer to a failure: act on it now,
                # not after the failure's backoff (up to a minute).
                if sid in self.running:
                    continue  # looked at again once its step is done
                if self._versions.get(sid, version) != version:
                    self.due[sid] = 0.0
                    self.runtimes[sid].reconsider()
                self._versions[sid] = version
            for sid in set(self.runtimes) - wanted:
                if sid not in self.running:
                    self.runtimes.pop(sid).close()
                    self.due.pop(sid, None)
                    self._versions.pop(sid, None)

    def _start_spark(self) -> None:
        """Build the Spark session while the first supervisors capture offsets and create their
        tables: a fresh daemon's first batch then waits for what is left of its start (about
        4 s of JVM, on a local master), not all of it. The batch asks for the session as
        always and gets this one, or the failure again, reported there."""
        try:
            self.ctx.spark()
        except Exception:  # noqa: BLE001 - the first batch meets it and reports it
            log.debug("starting the Spark session ahead of the first batch failed", exc_info=True)

    def _submit_due(self, now: float) -> None:
        held_until = self._held_until  # one read: ``open`` may clear it from another thread
        if held_until:
            if now < held_until:
                return
            log.warning("the first reconcile pass of this term has not run within %gs; starting the "
                        "supervisors without it (markers and stanzas apply at the next pass)", self._held_for)
            self._held_until = 0.0
        with self._lock:
            if self._stop.is_set():
                return
            free = self.workers - sum(1 for s in self.running.values() if not s.abandoned)
            due = sorted((self.due.get(sid, 0.0), sid) for sid in self.runtimes
                         if sid not in self.running and self.due.get(sid, 0.0) <= now)
            for _, sid in due[:max(0, free)]:
                rt = self.runtimes[sid]
                thread = threading.Thread(target=self._run, args=(sid, rt), name=f"runtime-{sid}", daemon=True)
                self.running[sid] = _Step(thread)
                thread.start()

    def _run(self, sid: str, rt: SupervisorRuntime) -> None:
        try:
            outcome: StepOutcome = rt.step()
        except Exception:  # step() catches what it expects; anything else is a bug: back off and log
            log.exception("runtime step crashed", extra={"supervisor": sid})
            outcome = StepOutcome(5.0)
        self._done(sid, outcome)

    def _abandon_overdue(self, now: float) -> None:
        limit = self._step_timeout()
        with self._lock:
            overdue = [(sid, step) for sid, step in self.running.items()
                       if not step.abandoned and now - step.started > limit]
            for _, step in overdue:
                step.abandoned = True  # its place among the workers goes to the next due supervisor
        for sid, step in overdue:
            message = (f"a step has run for {now - step.started:.0f}s, over the {limit:g}s limit (stepTimeout), "
                       f"stuck {_where(step.thread)}; its thread is left to finish and the supervisor is not "
                       "stepped again until it does")
            log.error("%s", message, extra={"supervisor": sid})
            try:
                self.ctx.store.set_detailed(sid, State.UNHEALTHY_SUPERVISOR, DetailedState.UNHEALTHY_SUPERVISOR,
                                            message)
            except Exception:  # noqa: BLE001 - the report can wait for the database; the others go on
                log.warning("cannot record that %s is stuck", sid, exc_info=True)
            if self.ctx.metrics:
                self.ctx.metrics.set_failing(sid, message)

    def _done(self, sid: str, outcome: StepOutcome) -> None:
        progressed = bool(outcome.records or outcome.done)
        with self._lock:
            step = self.running.pop(sid, None)
            since = step.started if step is not None and outcome.cadence else time.monotonic()
            self.due[sid] = since + outcome.delay
            if (outcome.done or self._stop.is_set()) and sid in self.runtimes:
                self.runtimes.pop(sid).close()
                self.due.pop(sid, None)
            now_idle = self._ring_when_idle and not self.running
            if now_idle:
                self._ring_when_idle = False
        if step is not None:
            if step.abandoned:
                log.warning("the step that overstayed its limit came back after %.0fs",
                            time.monotonic() - step.started, extra={"supervisor": sid})
            step.finished.set()
        if progressed:
            self._poke.set()
        if (progressed or now_idle) and self._on_progress is not None:
            # only then: idle steps of many supervisors would keep the loop awake
            self._on_progress()


def _where(thread: threading.Thread) -> str:
    """Where a thread is, as ``in <function> (<file>:<line>)`` of its innermost Python frame."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "in an unknown place"
    code = frame.f_code
    return f"in {code.co_name} ({code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno})"
