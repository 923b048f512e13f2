"""The daemon (``reconciler run``): watch + tick loop, leader lease, signals, sd_notify.

The loop, in order, each time round:

1. hold or take the leader lease (a standby daemon stops here, and says so);
2. reconcile when the spec directory changed (debounced) or the tick is due;
3. let the runtime manager pick up what changed (it ingests on its own threads:
   the tick never waits on Spark);
4. tell systemd WATCHDOG=1 and a one-line STATUS, from this loop itself, so a hung
   tick is caught;
5. with ``--until-caught-up``, exit once everything reached its target.

SIGTERM stops scheduling and lets in-flight batches publish (or be fenced), then
exits 0; a second SIGTERM exits at once: a batch cut short publishes nothing and its
staged files are removed at the next start. SIGHUP re-reads the config file and
swaps the settings whole.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

from reconciler import logs, notify
from reconciler import settings as settings_mod
from reconciler.actual import Kind, State
from reconciler.apply import Applier
from reconciler.errors import ReconcilerError
from reconciler.plan import PlanSettings
from reconciler.reconcile import reconcile_once
from reconciler.runtime.batching import caught_up
from reconciler.runtime.manager import RuntimeManager
from reconciler.runtime.recovery import recover
from reconciler.runtime.supervisor import RUNNABLE, RuntimeContext
from reconciler.settings import Settings
from reconciler.store.store import Store
from reconciler.streams import adapter_for

log = logging.getLogger(__name__)


class _SpecWatcher:
    """watchdog events on the spec directory, debounced into one 'dirty since' time."""

    def __init__(self, directory: str, wake: threading.Event):
        self.directory = directory
        self.wake = wake
        self.last_event: float | None = None
        self._observer = None

    def start(self) -> None:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.event_type in ("opened", "closed_no_write"):
                    return
                watcher.last_event = time.monotonic()
                watcher.wake.set()

        if not Path(self.directory).is_dir():
            log.warning("spec directory %s does not exist; relying on the periodic tick", self.directory)
            return
        self._observer = Observer()
        self._observer.schedule(Handler(), self.directory, recursive=False)
        self._observer.daemon = True
        self._observer.start()

    def settled(self, debounce: float) -> bool:
        """Events happened and the directory has been quiet for ``debounce`` seconds (and no git op runs)."""
        if self.last_event is None:
            return False
        if (Path(self.directory) / ".git" / "index.lock").exists():
            return False
        return time.monotonic() - self.last_event >= debounce

    def consume(self) -> None:
        self.last_event = None

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)


class Daemon:
    def __init__(self, settings: Settings, *, config_path: str | None = None, cli_values: dict | None = None):
        self.settings = settings
        self.config_path = config_path
        self.cli_values = cli_values or {}
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.wake = threading.Event()
        self.signals = 0
        self.reload = False
        self.lease_token: int | None = None
        self.manager: RuntimeManager | None = None
        self.metrics = None
        self._spark_lock = threading.Lock()
        self._notes: tuple[str, ...] = ()
        self._targets: dict[str, dict[str, int]] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def run(self, *, until_caught_up: bool = False, timeout: float | None = None) -> int:
        s = self.settings
        s.state_path.mkdir(parents=True, exist_ok=True)
        s.segments_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
        self.store = Store(s.db_url)
        self.store.migrate()
        self._install_signals()
        self._start_http()
        watcher = _SpecWatcher(s.specs, self.wake)
        watcher.start()
        deadline = time.monotonic() + timeout if timeout else None
        next_tick = 0.0
        last_ping = 0.0
        ready = False
        log.info("daemon %s starting: specs=%s db=%s segments=%s", self.holder, s.specs,
                 _redacted_url(s.db_url), s.segments_dir)
        try:
            while self.signals == 0:
                if self.reload:
                    self._reload()
                leader = self._hold_lease()
                now = time.monotonic()
                if leader and (now >= next_tick or watcher.settled(self.settings.debounce)):
                    watcher.consume()
                    self._tick()
                    next_tick = time.monotonic() + self.settings.tick_interval
                if not ready:
                    notify.notify("READY=1", f"STATUS={self._status_line(leader)}")
                    ready = True
                if now - last_ping >= 1.0:
                    notify.notify("WATCHDOG=1", f"STATUS={self._status_line(leader)}")
                    last_ping = now
                if until_caught_up and leader and self._caught_up():
                    log.info("caught up: every supervisor reached its target")
                    return 0
                if deadline and time.monotonic() > deadline:
                    log.error("--until-caught-up: not caught up within %.0fs", timeout)
                    return 1
                self.wake.wait(self._sleep_for(leader, next_tick, until_caught_up))
                self.wake.clear()
            return 0
        finally:
            notify.notify("STOPPING=1", "STATUS=stopping: finishing in-flight batches")
            log.info("stopping: finishing or fencing in-flight batches")
            watcher.stop()
            if self.manager is not None:
                self.manager.stop(wait=True)
            if self.lease_token is not None:
                self.store.release_lease(self.holder)
            self.store.close()
            log.info("stopped")

    def _install_signals(self) -> None:
        def on_term(signum, _frame):
            self.signals += 1
            if self.signals > 1:
                log.warning("second signal: exiting now (staged batches are cleaned up at next start)")
                os._exit(1)
            self.wake.set()

        def on_hup(_signum, _frame):
            self.reload = True
            self.wake.set()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_term)
            signal.signal(signal.SIGINT, on_term)
            signal.signal(signal.SIGHUP, on_hup)

    def _reload(self) -> None:
        self.reload = False
        notify.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        try:
            new = settings_mod.load(self.cli_values, self.config_path)
            if new.db_url != self.settings.db_url or new.segments_dir != self.settings.segments_dir:
                log.warning("SIGHUP: db and segments cannot change while running; restart to change them")
                new = settings_mod.Settings(**{**new.__dict__, "db": self.settings.db, "segments": self.settings.segments,
                                               "state_dir": self.settings.state_dir})
            self.settings = new
            logs.setup(new.log_level, new.log_format)
            log.info("SIGHUP: settings reloaded")
        except ReconcilerError as exc:
            log.error("SIGHUP: config not reloaded, keeping the old settings: %s", exc)
        notify.notify("READY=1")

    # -- leadership --------------------------------------------------------------------

    def _hold_lease(self) -> bool:
        try:
            token = self.store.acquire_lease(self.holder, self.settings.lease_ttl)
        except ReconcilerError as exc:
            log.warning("cannot reach the database for the lease: %s", exc)
            token = None
        if token is not None and self.lease_token is None:
            log.info("leader: lease taken (token %d)", token)
            self._become_leader()
        elif token is None and self.lease_token is not None:
            log.error("leader lease lost; stopping runtimes (their publishes are fenced)")
            if self.manager is not None:
                self.manager.stop(wait=False)
                self.manager = None
        elif token is None and self.lease_token is None:
            holder = (self.store.lease() or {}).get("holder", "?")
            if getattr(self, "_standby_logged", None) != holder:
                log.info("standby: %s holds the leader lease", holder)
                self._standby_logged = holder
        self.lease_token = token
        if self.metrics:
            self.metrics.leader.set(1 if token else 0)
        return token is not None

    def _become_leader(self) -> None:
        recover(self.store, self.settings.segments_dir)
        ctx = RuntimeContext(store=self.store, segments_dir=self.settings.segments_dir, spark=self._spark,
                             lease=self._lease, metrics=self.metrics)
        self.manager = RuntimeManager(ctx)
        self.manager.start()

    def _lease(self) -> tuple[str, int] | None:
        return (self.holder, self.lease_token) if self.lease_token is not None else ("-", -1)

    def _spark(self):
        from reconciler.pipeline.spark import get_session

        with self._spark_lock:
            return get_session(self.settings.spark_master)

    # -- the tick -------------------------------------------------------------------------

    def _tick(self) -> None:
        started = time.monotonic()
        applier = Applier(self.store, actor=f"daemon:{self.holder}", state_dir=self.settings.state_path)
        ps = PlanSettings(max_termination_share=self.settings.max_termination_share)
        try:
            result = reconcile_once(self.settings.specs, applier, ps)
        except ReconcilerError as exc:
            log.error("reconcile aborted (nothing concluded): %s", exc)
            return
        if result.plan.notes != self._notes:
            for note in result.plan.notes:
                log.warning("%s", note)
            self._notes = result.plan.notes
        if self.manager is not None:
            self.manager.poke()
        if self.metrics:
            self.metrics.tick_seconds.observe(time.monotonic() - started)
            self.metrics.last_tick = time.monotonic()
            actual = self.store.read_actual()
            self.metrics.set_states({k: str(v.state) for k, v in actual.supervisors.items()}, [str(x) for x in State])

    def _sleep_for(self, leader: bool, next_tick: float, until_caught_up: bool) -> float:
        horizon = max(0.05, next_tick - time.monotonic()) if leader else self.settings.lease_ttl / 3
        cap = 0.5 if until_caught_up else 1.0
        return min(horizon, cap, self.settings.lease_ttl / 3)

    def _status_line(self, leader: bool) -> str:
        if not leader:
            return "standby"
        n = len(self.manager.runtimes) if self.manager else 0
        return f"leader, {n} supervisor runtime(s)"

    # -- --until-caught-up ------------------------------------------------------------------

    def _caught_up(self) -> bool:
        actual = self.store.read_actual()
        if self._targets is None:
            targets = {}
            for sid, rec in actual.supervisors.items():
                if rec.kind == Kind.MAIN and rec.state in RUNNABLE:
                    try:
                        adapter = adapter_for(rec.spec.source)
                        try:
                            targets[sid] = adapter.latest()
                        finally:
                            adapter.close()
                    except ReconcilerError as exc:
                        log.warning("%s: cannot read latest offsets yet: %s", sid, exc)
                        return False
            self._targets = targets
            log.info("--until-caught-up targets: %s", targets)
        for sid, target in self._targets.items():
            rec = actual.supervisors.get(sid)
            if rec is None or rec.state not in RUNNABLE:
                continue
            if not caught_up(actual.checkpoints.get(sid, {}), target):
                return False
        pending_backfills = [sid for sid, r in actual.supervisors.items()
                             if r.kind == Kind.BACKFILL and r.state not in (State.COMPLETED, State.TERMINATED)]
        return not pending_backfills and (self.manager is None or self.manager.idle())

    def _start_http(self) -> None:
        if not self.settings.http:
            return
        from reconciler.metrics import Metrics, serve

        self.metrics = Metrics()
        self.metrics.max_tick_age = max(120.0, 3 * self.settings.tick_interval)
        try:
            self._http = serve(self.metrics, self.settings.http)
            log.info("metrics on http://%s/metrics, health on /healthz", self.settings.http)
        except OSError as exc:
            log.warning("cannot serve metrics on %s: %s (continuing without)", self.settings.http, exc.strerror)


def _redacted_url(url: str) -> str:
    from reconciler.spec.secrets import redact_uri

    return redact_uri(url)
