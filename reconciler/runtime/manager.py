"""Schedules supervisor runtimes on a small thread pool, beside the daemon's tick.

The manager re-reads the supervisor table on its own (every ``refresh`` seconds, or
at once when the daemon pokes it after a reconcile), so supervisors created by
another process (``reconciler reset`` generating a backfill) start without a tick.
A runtime is never stepped twice at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

from reconciler.runtime.supervisor import RUNNABLE, RuntimeContext, StepOutcome, SupervisorRuntime

log = logging.getLogger(__name__)


class RuntimeManager:
    def __init__(self, ctx: RuntimeContext, *, workers: int = 2, refresh: float = 1.0,
                 compact_every: float = 0.0, compact_lateness: float = 3600.0,
                 maintain_every: float = 0.0, snapshot_retention: float = 3600.0,
                 on_progress: Callable[[], None] | None = None):
        from reconciler.runtime.compactor import Compactor

        self.ctx = ctx
        self.compactor = Compactor(ctx, every=compact_every, lateness=compact_lateness,
                                   maintain_every=maintain_every, snapshot_retention=snapshot_retention)
        self.refresh = refresh
        self._on_progress = on_progress  # the daemon's bell: a batch or a backfill done may mean caught up
        self.runtimes: dict[str, SupervisorRuntime] = {}
        self.due: dict[str, float] = {}
        self._versions: dict[str, tuple] = {}  # (spec hash, epoch) each runtime last saw
        self.running: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="runtime")
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="runtime-manager", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """Re-read supervisors now (after a reconcile changed them)."""
        self._poke.set()

    def idle(self) -> bool:
        with self._lock:
            return not self.running

    def stop(self, wait: bool = True) -> None:
        """Stop scheduling; with ``wait``, let in-flight batches finish (publish or be fenced)."""
        self.compactor.stop()
        self._stop.set()
        self._poke.set()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown(wait=wait, cancel_futures=True)
        with self._lock:  # a runtime still stepping (wait=False) is closed by _done, not under its feet
            idle = [rt for sid, rt in self.runtimes.items() if sid not in self.running]
        for rt in idle:
            rt.close()

    def _loop(self) -> None:
        last_sync = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if self._poke.is_set() or now - last_sync >= self.refresh:
                self._poke.clear()
                try:
                    self._sync()
                except Exception:  # the database is unreachable: keep what we have, try again
                    log.warning("cannot refresh supervisors", exc_info=True)
                last_sync = now
            self._submit_due(now)
            self.compactor.maybe_run(now)
            self._poke.wait(0.05)

    def _sync(self) -> None:
        actual = self.ctx.store.read_actual()
        wanted = {sid for sid, r in actual.supervisors.items() if r.state in RUNNABLE}
        with self._lock:
            for sid in wanted - set(self.runtimes):
                self.runtimes[sid] = SupervisorRuntime(sid, self.ctx)
                self.due[sid] = 0.0
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

    def _submit_due(self, now: float) -> None:
        with self._lock:
            for sid, rt in self.runtimes.items():
                if sid not in self.running and self.due.get(sid, 0.0) <= now:
                    fut = self._pool.submit(rt.step)
                    self.running[sid] = fut
                    fut.add_done_callback(lambda f, sid=sid: self._done(sid, f))

    def _done(self, sid: str, fut: Future) -> None:
        try:
            outcome: StepOutcome = fut.result()
        except CancelledError:  # stop() cancelled a step that never started: nothing ran, nothing to report
            outcome = StepOutcome(0.0)
        except Exception:  # step() catches what it expects; anything else is a bug: back off and log
            log.exception("runtime step crashed", extra={"supervisor": sid})
            outcome = StepOutcome(5.0)
        with self._lock:
            self.running.pop(sid, None)
            self.due[sid] = time.monotonic() + outcome.delay
            if (outcome.done or self._stop.is_set()) and sid in self.runtimes:
                self.runtimes.pop(sid).close()
                self.due.pop(sid, None)
        if outcome.records or outcome.done:
            self._poke.set()
            if self._on_progress is not None:  # only then: idle steps of many supervisors would keep it awake
                self._on_progress()
