"""The daemon (``reconciler run``): watch + tick loop, leader lease, signals, sd_notify.

The loop, in order, each time round (at least once a second):

1. hold or take the leader lease (a standby daemon stops here, and says so in its
   log, its systemd STATUS, ``/healthz`` and ``reconciler status``);
2. reconcile when the spec directory changed and has settled (no file event for
   ``debounce`` seconds and no ``.git/index.lock``: an editor's atomic save or a
   ``git checkout`` of many files gives ONE pass over the final files), or when the
   safety-net tick is due (it too waits for a busy directory). A pass whose files
   changed while they were being read is dropped and redone: no pass acts on half a
   change;
3. the runtime manager ingests on its own threads (poked after a pass): the loop
   never waits on Spark;
4. tell systemd WATCHDOG=1 and a one-line STATUS, from this loop itself, so a hung
   loop is caught by ``WatchdogSec``;
5. with ``--until-caught-up``, exit 0 once everything reached its target. It exits 1,
   naming what is not caught up and why, when a supervisor stays UNHEALTHY for
   ``UNHEALTHY_GRACE`` seconds (a permanent failure would otherwise keep a cron job
   waiting forever), when ``--timeout`` runs out, or when a signal stops it first.

SIGTERM (or SIGINT) stops scheduling, lets in-flight batches publish (or be fenced),
tells systemd STOPPING=1, releases the lease and exits 0; a second one exits at once
(re-raised with the default action): a batch cut short publishes nothing and its
staged files are removed by the next leader's recovery. SIGHUP re-reads the config
file and swaps the settings whole (RELOADING=1 ... READY=1): the next pass, the lease, the
leader's compaction and maintenance schedule, the spec watcher, the HTTP address and the
log format take the new values; the database, segments, state directory, Spark master,
Spark settings and snapshots kept (``RESTART_FIELDS``) need a restart. Signal handlers only set a flag and
ring the loop's self-pipe (``waker``): the loop does the work, so a storm of signals
cannot deadlock it.

Nothing one pass, one file or one supervisor does ends the loop: an unexpected error is
logged with its traceback, counted as an aborted pass (``/healthz`` says so) and the loop
goes on. ``/healthz`` also turns 503 when the loop has not gone round for the lease TTL
(at least 10 s): by then the daemon has lost, or is losing, its lease.

The parts, one module each, composed by ``Daemon`` (the loop, signals, reload, shutdown):
``watcher`` (the spec directory), ``leadership`` (the lease, the role, the heartbeat; how a
deposed leader is fenced and how a pass longer than the lease keeps it), ``tick`` (the
reconcile pass, the STATUS summary, ``--until-caught-up``), ``freshness`` (the leader's lag
observer and webhook delivery) and ``http`` (the status page, ``/metrics``, ``/healthz``).

May import every layer below it (``control``, ``observe``, ``runtime`` and theirs);
only ``cli`` imports it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid

from reconciler import logs
from reconciler import settings as settings_mod
from reconciler.daemon import notify
from reconciler.daemon.waker import Waker
from reconciler.errors import Misconfigured, ReconcilerError
from reconciler.observe.metrics import Metrics
from reconciler.runtime.manager import RuntimeManager
from reconciler.settings import Settings
from reconciler.spec import grants
from reconciler.store.store import Store

from .freshness import Freshness
from .http import HttpEndpoint
from .leadership import Leadership
from .tick import SUMMARY_EVERY, CatchUp, Tick
from .watcher import MAX_HOLD, SpecWatcher

__all__ = ["Daemon", "SpecWatcher", "Leadership", "Tick", "CatchUp", "HttpEndpoint",
           "MAX_HOLD", "SUMMARY_EVERY", "RESTART_FIELDS", "RESTART_KEYS"]

log = logging.getLogger(__name__)

# Not swapped by SIGHUP: what the process opened (the database, the directories, the Spark
# session) and what a leadership term's runtimes are built with (snapshots_kept).
RESTART_FIELDS = ("db", "segments", "object_store", "catalog", "state_dir", "spark_master", "spark_conf", "snapshots_kept",
                  "reader_grace")


def _key(name: str) -> str:
    """A setting's config-file key, the name an operator knows it by."""
    return next(f.metadata["key"] for f in dataclasses.fields(Settings) if f.name == name)


RESTART_KEYS = ", ".join(_key(name) for name in RESTART_FIELDS)


class Daemon:
    def __init__(self, settings: Settings, *, config_path: str | None = None, cli_values: dict | None = None):
        self.settings = settings
        self.config_path = config_path
        self.cli_values = cli_values or {}
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.wake = Waker()
        self.signals = 0
        self._signal_name: str | None = None
        self.reload = False
        self.metrics = Metrics()
        # The parts need the database, which is opened by run(), not by the constructor.
        self._leadership: Leadership | None = None
        self._tick: Tick | None = None
        self._http: HttpEndpoint | None = None
        self.freshness: Freshness | None = None  # the lag observer and the webhook, while leading
        self._ping_every = 1.0
        self._last_ping = 0.0

    # Read from other threads (tests, benchmarks) while run() goes on, and before it starts.

    @property
    def lease_token(self) -> int | None:
        return self._leadership.lease_token if self._leadership else None

    @property
    def manager(self) -> RuntimeManager | None:
        return self._leadership.manager if self._leadership else None

    @property
    def passes(self) -> int:
        """Reconcile passes that applied at least one action."""
        return self._tick.passes if self._tick else 0

    # -- lifecycle -------------------------------------------------------------------

    def run(self, *, until_caught_up: bool = False, timeout: float | None = None) -> int:
        s = self.settings
        _make_dirs(s)
        grants.grant(grants.Grants.from_settings(s))  # before Spark starts: its workers inherit them
        if s.remote_warehouse or s.object_store:  # its secret references resolved with those grants
            from reconciler.table import storage

            storage.configure_from(s)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from reconciler.pipeline import arrowpool
        from reconciler.pipeline.spark import set_status_file

        arrowpool.use_preferred()  # the publish's and compaction's pool (a daemon run outside `reconciler` too)

        set_status_file(s.state_path / "spark.json")  # for `reconciler status`: which master, which application
        self.store = Store(s.db_url)
        self.store.migrate()

        def current() -> Settings:  # SIGHUP swaps the settings whole: the parts ask at each use
            return self.settings

        leadership = self._leadership = Leadership(self.store, current, self.holder, self.metrics, ping=self._ping,
                                                    wake=self.wake.ring)
        tick = self._tick = Tick(self.store, current, self.holder, self.metrics, leadership)
        catch_up = CatchUp(self.store, leadership, concluded=lambda: tick.concluded > 0)
        freshness = self.freshness = Freshness(self.store, current, self.metrics,
                                               on_due=lambda: (tick.request_pass(), self.wake.ring()))
        http = self._http = HttpEndpoint(self.store, self.metrics, freshness)
        try:
            http.start(s.http)  # a configured /healthz that cannot listen fails the start
        except Misconfigured:
            self.store.close()
            raise
        self._install_signals()
        self._ping_every = min(1.0, notify.watchdog_interval() or 1.0)
        self.metrics.max_loop_age = max(10.0, s.lease_ttl)
        watcher = SpecWatcher(s.specs, self.wake).start()
        deadline = time.monotonic() + timeout if timeout else None
        next_tick, ready = 0.0, False
        log.info("daemon %s starting: specs=%s db=%s segments=%s", self.holder, s.specs,
                 _redacted_url(s.db_url), s.warehouse)
        try:
            while self.signals == 0:
                if self.reload:
                    watcher, next_tick = self._reload(watcher, next_tick)
                try:
                    leader = leadership.hold()
                    freshness.follow(leader)  # before the pass: the webhook knows where the term starts
                    if leader:
                        next_tick = tick.maybe_reconcile(watcher, next_tick)
                        tick.refresh_summary()
                except Exception as exc:  # noqa: BLE001 (one bad round must not end the daemon)
                    log.exception("unexpected error in the daemon loop (continuing): %s", exc)
                    self.metrics.reconcile_done("aborted", 0.0, error=f"unexpected error: {exc}")
                    leader, next_tick = leadership.lease_token is not None, time.monotonic() + 1.0
                self.metrics.loop_alive()
                if not ready:
                    notify.notify("READY=1", f"STATUS={self.status_line()}")
                    ready = True
                self._ping()
                if until_caught_up and leader and catch_up.caught_up():
                    log.info("caught up: every supervisor reached its target")
                    return 0
                if until_caught_up and catch_up.stuck:
                    log.error("--until-caught-up: giving up, not caught up: %s", "; ".join(catch_up.stuck))
                    return 1
                if deadline and time.monotonic() > deadline:
                    log.error("--until-caught-up: not caught up within %.0fs: %s", timeout, catch_up.pending_text())
                    return 1
                # the next WATCHDOG=1 is due then, not a hair before (waking earlier would skip a ping)
                ping_due = max(0.02, self._last_ping + self._ping_every - time.monotonic())
                self.wake.wait(tick.sleep_for(leader, next_tick, watcher, until_caught_up, ping_due))
            if self._signal_name:
                log.info("%s: stopping after in-flight batches (send it again to exit at once)",
                         self._signal_name)
            if until_caught_up:
                log.error("--until-caught-up: stopped by %s before catching up: %s", self._signal_name or "a signal",
                          catch_up.pending_text())
                return 1
            return 0
        finally:
            self._shutdown(watcher, leadership, http, freshness)

    def request_stop(self) -> None:
        """What the first SIGTERM does (for a daemon run in a thread, e.g. in tests)."""
        self.signals += 1
        self.wake.ring()

    def request_reload(self) -> None:
        """What SIGHUP does: a flag and the bell, nothing that takes a lock."""
        self.reload = True
        self.wake.ring()

    def _shutdown(self, watcher: SpecWatcher, leadership: Leadership, http: HttpEndpoint,
                  freshness: Freshness) -> None:
        in_flight = len(leadership.manager.running) if leadership.manager else 0
        notify.notify("STOPPING=1", f"STATUS=stopping: finishing or fencing {in_flight} in-flight batch(es)")
        log.info("stopping: finishing or fencing %d in-flight batch(es)", in_flight)
        watcher.stop()
        leadership.stop_runtimes(wait=True)
        freshness.stop()  # after the runtimes: what they audited last is delivered too
        leadership.release()
        http.stop()
        self.store.close()
        self.wake.close()
        log.info("stopped")

    def _install_signals(self) -> None:
        # Handlers run between two bytecodes of the main thread, perhaps inside a lock it
        # holds: they touch no lock (no logging, no Event), only flags, a pipe and stderr.
        def on_term(signum, _frame):
            self.signals += 1
            name = signal.Signals(signum).name
            if self.signals > 1:
                _write_stderr(f"second {name}: exiting now; a batch cut short publishes nothing "
                              "(its staged files are removed at the next start)\n")
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            self._signal_name = name
            self.wake.ring()

        def on_hup(_signum, _frame):
            self.request_reload()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_term)
            signal.signal(signal.SIGINT, on_term)
            signal.signal(signal.SIGHUP, on_hup)

    def _reload(self, watcher: SpecWatcher, next_tick: float) -> tuple[SpecWatcher, float]:
        self.reload = False
        notify.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}",
                      "STATUS=reloading the configuration")
        old = self.settings
        try:
            new = settings_mod.load(self.cli_values, self.config_path)
        except ReconcilerError as exc:
            log.error("SIGHUP: config not reloaded, keeping the old settings: %s", exc)
            notify.notify("READY=1", f"STATUS={self.status_line()}")
            return watcher, next_tick
        fixed = [f for f in RESTART_FIELDS if getattr(new, f) != getattr(old, f)]
        if fixed:
            log.warning("SIGHUP: %s cannot change while running (restart to change them); kept",
                        ", ".join(_key(f) for f in fixed))
        new = dataclasses.replace(new, **{f: getattr(old, f) for f in RESTART_FIELDS})
        try:
            granted = grants.Grants.from_settings(new)
        except ReconcilerError as exc:
            log.error("SIGHUP: config not reloaded, keeping the old settings: %s", exc)
            notify.notify("READY=1", f"STATUS={self.status_line()}")
            return watcher, next_tick
        self.settings = new
        grants.grant(granted)  # the next pass checks every spec against the new grants
        logs.setup(new.log_level, new.log_format)
        changes = [f"{f.metadata['key']} {getattr(old, f.name)!r} -> {getattr(new, f.name)!r}"
                   for f in dataclasses.fields(Settings) if getattr(old, f.name) != getattr(new, f.name)]
        log.info("SIGHUP: settings reloaded: %s (%s need a restart)", "; ".join(changes) or "no changes",
                 RESTART_KEYS)
        if self._leadership is not None:
            self._leadership.settings_changed()
        self.metrics.max_loop_age = max(10.0, new.lease_ttl)
        if new.specs != old.specs:
            watcher.stop()
            watcher = SpecWatcher(new.specs, self.wake).start()
            next_tick = 0.0
        if new.http != old.http and self._http is not None:
            self._http.switch(new.http)
        notify.notify("READY=1", f"STATUS={self.status_line()}")
        return watcher, min(next_tick, time.monotonic() + new.tick_interval)

    # -- telling the world: STATUS, WATCHDOG -----------------------------------------------

    def _ping(self) -> None:
        now = time.monotonic()
        if now - self._last_ping >= self._ping_every - 0.02:
            self._last_ping = now
            notify.notify("WATCHDOG=1", f"STATUS={self.status_line()}")

    def status_line(self) -> str:
        """The one-line summary systemd shows (``systemctl status``)."""
        leadership = self._leadership
        if leadership is None:  # run() has not started
            return "standby: leader is unknown"
        if leadership.lease_token is None:
            return f"standby: leader is {leadership.leader_seen or 'unknown'}"
        summary = self._tick.summary if self._tick else "starting"
        return f"leader (token {leadership.lease_token}): {summary}"


def _write_stderr(text: str) -> None:
    try:
        os.write(2, text.encode(errors="replace"))
    except OSError:  # stderr itself is gone (a closed terminal): nowhere left to say it
        pass


def _make_dirs(s: Settings) -> None:
    """The state and segments directories, or ``Misconfigured`` naming the setting."""
    dirs = [("stateDir (--state-dir, RECONCILER_STATE_DIR)", s.state_path)]
    if not s.remote_warehouse:  # a bucket's prefix needs no directory
        dirs.append(("segments (--segments, RECONCILER_SEGMENTS)", s.segments_dir))
    for key, path in dirs:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Misconfigured(f"setting {key}: cannot create {path}: {exc.strerror or exc}") from None


def _redacted_url(url: str) -> str:
    from reconciler.spec.secrets import redact_uri

    return redact_uri(url)
