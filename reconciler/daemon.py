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
file and swaps the settings whole (RELOADING=1 ... READY=1); the database, segments,
state directory and Spark master need a restart. Signal handlers only set a flag and
ring the loop's self-pipe (``waker``): the loop does the work, so a storm of signals
cannot deadlock it.

Nothing one pass, one file or one supervisor does ends the loop: an unexpected error is
logged with its traceback, counted as an aborted pass (``/healthz`` says so) and the loop
goes on. ``/healthz`` also turns 503 when the loop has not gone round for the lease TTL
(at least 10 s): by then the daemon has lost, or is losing, its lease.

Leadership: a lease row with a fencing token. The runtimes of one term publish with
that term's token, so once another daemon took over (the lease ran out while this
one was paused or cut off), their publishes fail in the database: a deposed leader
can no longer publish.

A pass can outlast the lease (the first pass over ten thousand files takes longer than
the default 15 s TTL): the pass renews the lease as the loop does, before each file it
loads, before it reads the database and before each action (``_leading_in_pass``), and
keeps ``/healthz``, WATCHDOG=1 and the heartbeat fresh while it makes progress. Nothing
renews the lease but this progress: a pass stuck on one call stops renewing, and a
standby takes over within the TTL as from a dead leader. A pass applies an action only
while the lease was renewed under the same token within half the TTL (a token unchanged
means held without a break); once it was lost, or could not be renewed, the rest of the
plan is not applied and the daemon steps down (or, if it took the lease again, starts a
new term with a new token) before anything else.
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
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from reconciler import logs, notify
from reconciler import settings as settings_mod
from reconciler.actual import Kind, State
from reconciler.apply import ActionResult, Applier
from reconciler.errors import ReconcilerError
from reconciler.metrics import Metrics, serve
from reconciler.plan import ActionKind, PlanSettings
from reconciler.reconcile import reconcile_once
from reconciler.runtime.batching import caught_up
from reconciler.runtime.manager import RuntimeManager
from reconciler.runtime.recovery import recover
from reconciler.runtime.supervisor import RUNNABLE, RuntimeContext
from reconciler.settings import Settings
from reconciler.spec.loader import SpecCache
from reconciler.store.store import Store
from reconciler.streams import adapter_for
from reconciler.waker import Waker

log = logging.getLogger(__name__)

MAX_HOLD = 30.0  # seconds a busy directory (endless events, a stale .git/index.lock) may hold passes back
SUMMARY_EVERY = 2.0  # seconds between refreshes of the STATUS line and the state gauges
RESTART_FIELDS = ("db", "segments", "state_dir", "spark_master", "spark_conf")  # not swapped by SIGHUP
UNHEALTHY_GRACE = 60.0  # seconds --until-caught-up waits for an UNHEALTHY supervisor to recover


class _SpecWatcher:
    """watchdog events on the spec directory: a counter, the time of the last event, and
    whether the directory is busy (events still coming, or a git operation under way)."""

    def __init__(self, directory: str, wake: Waker):
        self.directory = directory
        self.wake = wake
        self.events = 0
        self.last_event: float | None = None
        self._blocked_since: float | None = None
        self._warned = False
        self._observer = None

    def start(self) -> _SpecWatcher:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.event_type in ("opened", "closed_no_write"):
                    return
                watcher.events += 1
                watcher.last_event = time.monotonic()
                watcher.wake.set()

        if not Path(self.directory).is_dir():
            log.warning("spec directory %s does not exist; relying on the periodic tick", self.directory)
            return self
        self._observer = Observer()
        self._observer.schedule(Handler(), self.directory, recursive=False)
        self._observer.daemon = True
        self._observer.start()
        return self

    def pending(self) -> bool:
        return self.last_event is not None

    def git_busy(self) -> bool:
        return (Path(self.directory) / ".git" / "index.lock").exists()

    def blocked(self, debounce: float) -> bool:
        """A pass now could see a half-written directory. Held back at most MAX_HOLD seconds."""
        now = time.monotonic()
        busy = self.git_busy() or (self.last_event is not None and now - self.last_event < debounce)
        if not busy:
            self._blocked_since, self._warned = None, False
            return False
        if self._blocked_since is None:
            self._blocked_since = now
        if now - self._blocked_since < MAX_HOLD:
            return True
        if not self._warned:
            log.warning("spec directory %s has been busy for %.0fs (a stale .git/index.lock?); reconciling anyway",
                        self.directory, now - self._blocked_since)
            self._warned = True
        return False

    def wait_hint(self, debounce: float) -> float | None:
        """Seconds until pending events have settled, or None without pending events."""
        if self.last_event is None:
            return None
        return max(0.02, self.last_event + debounce - time.monotonic())

    def consume(self) -> int:
        """Forget pending events (a pass starts now); returns a mark for ``unchanged_since``."""
        self.last_event = None
        return self.events

    def unchanged_since(self, mark: int) -> bool:
        return self.events == mark and not self.blocked(0.0)

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
        self.wake = Waker()
        self.signals = 0
        self._signal_name: str | None = None
        self.reload = False
        self.lease_token: int | None = None
        self.manager: RuntimeManager | None = None
        self.metrics = Metrics()
        self.passes = 0  # reconcile passes that applied at least one action
        self._spark_lock = threading.Lock()
        self._notes: tuple[str, ...] = ()
        self._targets: dict[str, dict[str, int]] | None = None
        self._unhealthy_since: dict[str, float] = {}
        self._stuck: list[str] = []
        self._http = None
        self._ping_every = 1.0
        self._last_ping = 0.0
        self._lease_checked = 0.0
        self._lease_renewed = 0.0
        self._lease_lost_in_pass = False
        self._leader_seen: str | None = None
        self._beat: tuple[str, float] = ("", 0.0)
        self._summary, self._summary_at = "starting", 0.0
        self._spec_cache = SpecCache()  # files unchanged since the last pass are not parsed again

    # -- lifecycle -------------------------------------------------------------------

    def run(self, *, until_caught_up: bool = False, timeout: float | None = None) -> int:
        s = self.settings
        s.state_path.mkdir(parents=True, exist_ok=True)
        s.segments_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from reconciler.pipeline.spark import set_status_file

        set_status_file(s.state_path / "spark.json")  # for `reconciler status`: which master, which application
        self.store = Store(s.db_url)
        self.store.migrate()
        self._install_signals()
        self._start_http()
        self._ping_every = min(1.0, notify.watchdog_interval() or 1.0)
        self.metrics.max_loop_age = max(10.0, s.lease_ttl)
        watcher = _SpecWatcher(s.specs, self.wake).start()
        deadline = time.monotonic() + timeout if timeout else None
        next_tick, ready = 0.0, False
        log.info("daemon %s starting: specs=%s db=%s segments=%s", self.holder, s.specs,
                 _redacted_url(s.db_url), s.segments_dir)
        try:
            while self.signals == 0:
                if self.reload:
                    watcher, next_tick = self._reload(watcher, next_tick)
                try:
                    leader = self._hold_lease()
                    if leader:
                        next_tick = self._maybe_reconcile(watcher, next_tick)
                        self._refresh_summary()
                except Exception as exc:  # noqa: BLE001 (one bad round must not end the daemon)
                    log.exception("unexpected error in the daemon loop (continuing): %s", exc)
                    self.metrics.reconcile_done("aborted", 0.0, error=f"unexpected error: {exc}")
                    leader, next_tick = self.lease_token is not None, time.monotonic() + 1.0
                self.metrics.loop_alive()
                if not ready:
                    notify.notify("READY=1", f"STATUS={self.status_line()}")
                    ready = True
                self._ping()
                if until_caught_up and leader and self._caught_up():
                    log.info("caught up: every supervisor reached its target")
                    return 0
                if until_caught_up and self._stuck:
                    log.error("--until-caught-up: giving up, not caught up: %s", "; ".join(self._stuck))
                    return 1
                if deadline and time.monotonic() > deadline:
                    log.error("--until-caught-up: not caught up within %.0fs: %s", timeout, self._pending_text())
                    return 1
                self.wake.wait(self._sleep_for(leader, next_tick, watcher, until_caught_up))
            if self._signal_name:
                log.info("%s: stopping after in-flight batches (send it again to exit at once)",
                         self._signal_name)
            if until_caught_up:
                log.error("--until-caught-up: stopped by %s before catching up: %s", self._signal_name or "a signal",
                          self._pending_text())
                return 1
            return 0
        finally:
            self._shutdown(watcher)

    def request_stop(self) -> None:
        """What the first SIGTERM does (for a daemon run in a thread, e.g. in tests)."""
        self.signals += 1
        self.wake.ring()

    def request_reload(self) -> None:
        """What SIGHUP does: a flag and the bell, nothing that takes a lock."""
        self.reload = True
        self.wake.ring()

    def _shutdown(self, watcher: _SpecWatcher) -> None:
        in_flight = len(self.manager.running) if self.manager else 0
        notify.notify("STOPPING=1", f"STATUS=stopping: finishing or fencing {in_flight} in-flight batch(es)")
        log.info("stopping: finishing or fencing %d in-flight batch(es)", in_flight)
        watcher.stop()
        self._stop_runtimes(wait=True)
        try:
            if self.lease_token is not None:
                self.store.release_lease(self.holder)
            self.store.forget_daemon(self.holder)
        except ReconcilerError as exc:
            log.warning("could not release the lease (it expires by itself): %s", exc)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
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

    def _reload(self, watcher: _SpecWatcher, next_tick: float) -> tuple[_SpecWatcher, float]:
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
            log.warning("SIGHUP: %s cannot change while running (restart to change them); kept", ", ".join(fixed))
        new = dataclasses.replace(new, **{f: getattr(old, f) for f in RESTART_FIELDS})
        self.settings = new
        logs.setup(new.log_level, new.log_format)
        changes = [f"{f.metadata['key']} {getattr(old, f.name)!r} -> {getattr(new, f.name)!r}"
                   for f in dataclasses.fields(Settings) if getattr(old, f.name) != getattr(new, f.name)]
        log.info("SIGHUP: settings reloaded: %s", "; ".join(changes) or "no changes")
        if new.specs != old.specs:
            watcher.stop()
            watcher = _SpecWatcher(new.specs, self.wake).start()
            next_tick = 0.0
        if new.http != old.http:
            if self._http is not None:
                self._http.shutdown()
                self._http.server_close()
                self._http = None
            self._start_http()
        notify.notify("READY=1", f"STATUS={self.status_line()}")
        return watcher, min(next_tick, time.monotonic() + new.tick_interval)

    # -- leadership --------------------------------------------------------------------

    def _hold_lease(self) -> bool:
        """Take or renew the lease (at most every min(1s, ttl/5)); True while we lead."""
        now = time.monotonic()
        ttl = self.settings.lease_ttl
        if now - self._lease_checked < min(1.0, ttl / 5):
            return self.lease_token is not None
        self._lease_checked = now
        try:
            token = self.store.acquire_lease(self.holder, ttl)
            self.metrics.database_error = None
        except ReconcilerError as exc:
            self.metrics.database_error = str(exc)
            if self.lease_token is not None and now - self._lease_renewed < ttl:
                log.warning("cannot renew the leader lease (%s); leading until it would expire", exc)
                return True
            log.warning("cannot reach the database for the lease: %s", exc)
            token = None
        if token is not None:
            self._lease_renewed = now
        if token != self.lease_token:
            self._change_role(token)
            if self.lease_token is not None:
                self._lease_checked = 0.0  # taking over (recovery) took a while: renew at the first chance
        if self.lease_token is None:
            self._note_standby()
            if self.metrics.role != "standby":  # started as a standby
                self.metrics.set_role("standby")
        self._heartbeat()
        return self.lease_token is not None

    def _leading_in_pass(self) -> bool:
        """The pass's ``leading`` (see ``reconcile_once``): renew the lease when due, as the loop
        does, and show the loop's signs of life while a long pass makes progress. True while
        the lease is held under this term's token and was renewed within half the TTL."""
        token = self.lease_token
        if token is None or self._lease_lost_in_pass:
            return False
        now = time.monotonic()
        ttl = self.settings.lease_ttl
        if now - self._lease_checked >= min(1.0, ttl / 5):
            self._lease_checked = now
            try:
                renewed = self.store.acquire_lease(self.holder, ttl)
                self.metrics.database_error = None
            except ReconcilerError as exc:
                self.metrics.database_error = str(exc)
                log.warning("cannot renew the leader lease during a reconcile pass: %s", exc)
            else:
                if renewed != token:  # another holds it, or it ran out and we took it again: a new term
                    self._lease_lost_in_pass = True
                    self._lease_checked = 0.0  # the loop settles the role before anything else
                    log.error("leader lease (token %d) lost during a reconcile pass; nothing more is applied",
                              token)
                    return False
                self._lease_renewed = now
            self._heartbeat()
            self.metrics.loop_alive()
            self._ping()
        return time.monotonic() - self._lease_renewed < ttl / 2

    def _change_role(self, token: int | None) -> None:
        if self.lease_token is not None:
            log.error("leader lease lost (token %d); stopping runtimes: their publishes are fenced", self.lease_token)
            self._stop_runtimes(wait=False)
            self.lease_token = None
        if token is not None:
            try:
                self._become_leader(token)
            except ReconcilerError as exc:
                log.error("cannot start leading (will retry): %s", exc)
                token = None
        self.lease_token = token
        self._leader_seen = None
        self.metrics.set_role("leader" if token is not None else "standby")

    def _become_leader(self, token: int) -> None:
        previous = self._leader_seen
        recover(self.store, self.settings.segments_dir)
        holder = self.holder
        # This term's runtimes publish with this term's token: after a takeover they are fenced.
        ctx = RuntimeContext(store=self.store, segments_dir=self.settings.segments_dir, spark=self._spark,
                             lease=lambda: (holder, token), metrics=self.metrics)
        self.manager = RuntimeManager(ctx, compact_every=self.settings.compact_interval,
                                      compact_lateness=self.settings.compact_lateness,
                                      maintain_every=self.settings.maintain_interval,
                                      snapshot_retention=self.settings.snapshot_retention)
        self.manager.start()
        log.info("leader: lease taken (token %d)%s", token,
                 f", {previous}'s lease having run out" if previous and previous != holder else "")

    def _note_standby(self) -> None:
        try:
            holder = (self.store.lease() or {}).get("holder", "nobody")
        except ReconcilerError:
            holder = "unknown (database unreachable)"
        if holder != self._leader_seen:
            log.info("standby: %s holds the leader lease; taking over if it is not renewed for %gs",
                     holder, self.settings.lease_ttl)
            self._leader_seen = holder

    def _heartbeat(self) -> None:
        role = "leader" if self.lease_token is not None else "standby"
        now = time.monotonic()
        if self._beat[0] == role and now - self._beat[1] < self.settings.lease_ttl / 3:
            return
        try:
            self.store.heartbeat(self.holder, role, self.settings.lease_ttl)
            self._beat = (role, now)
        except ReconcilerError:
            pass

    def _stop_runtimes(self, *, wait: bool) -> None:
        if self.manager is not None:
            self.manager.stop(wait=wait)
            self.manager = None

    def _spark(self):
        from reconciler.pipeline.spark import get_session

        with self._spark_lock:
            return get_session(self.settings.spark_master, conf=self.settings.spark_conf,
                               shared_dir=self.settings.segments_dir)

    # -- reconcile passes ---------------------------------------------------------------

    def _maybe_reconcile(self, watcher: _SpecWatcher, next_tick: float) -> float:
        """Reconcile if files changed or the tick is due, once the directory is quiet; the next tick time."""
        files = watcher.pending()
        if not files and time.monotonic() < next_tick:
            return next_tick
        if watcher.blocked(self.settings.debounce):
            return next_tick
        mark = watcher.consume()
        outcome = self._reconcile("files" if files else "tick", lambda: watcher.unchanged_since(mark))
        if outcome == "deferred":
            return time.monotonic()  # again as soon as the directory is quiet
        if outcome == "fenced":  # again once the lease is settled: by this daemon only if it leads again
            return time.monotonic() + min(1.0, self.settings.lease_ttl / 5)
        return time.monotonic() + self.settings.tick_interval

    def _reconcile(self, trigger: str, stable: Callable[[], bool]) -> str:
        started = time.monotonic()
        applier = Applier(self.store, actor=f"daemon:{self.holder}", state_dir=self.settings.state_path)
        ps = PlanSettings(max_termination_share=self.settings.max_termination_share)
        self._lease_lost_in_pass = False
        try:
            result = reconcile_once(self.settings.specs, applier, ps,
                                    check_permissions=not self.settings.allow_insecure_specs, stable=stable,
                                    cache=self._spec_cache, leading=self._leading_in_pass)
        except ReconcilerError as exc:
            log.error("reconcile aborted (nothing concluded): %s", exc)
            self.metrics.reconcile_done("aborted", time.monotonic() - started, error=str(exc))
            return "aborted"
        except Exception as exc:  # noqa: BLE001 (a bug or an input no check foresaw: report, go on)
            log.exception("reconcile aborted by an unexpected error (nothing concluded; the daemon "
                          "goes on): %s", exc)
            self.metrics.reconcile_done("aborted", time.monotonic() - started,
                                        error=f"unexpected error: {type(exc).__name__}: {exc}")
            return "aborted"
        if result is None:
            log.debug("the spec directory changed while it was read: pass dropped, redone when quiet")
            self.metrics.reconcile_done("deferred", time.monotonic() - started)
            return "deferred"
        if result.fenced:
            self._count_resets(result.results)
            log.error("reconcile pass (%s) stopped: the leader lease was lost or could not be renewed; "
                      "%d of %d action(s) applied, the rest left to the leader", trigger, len(result.results),
                      len(result.plan.actions))
            self._lease_checked = 0.0  # renew or step down at once
            self.metrics.reconcile_done("aborted", time.monotonic() - started,
                                        error="the leader lease was lost during the pass")
            return "fenced"
        if result.plan.notes != self._notes:
            for note in result.plan.notes:
                log.warning("%s", note)
            self._notes = result.plan.notes
        if self.manager is not None:
            self.manager.poke()
        self._count_resets(result.results)
        elapsed = time.monotonic() - started
        outcome = "changed" if result.results else "unchanged"
        if result.results:
            self.passes += 1
            failed = sum(1 for r in result.results if not r.ok)
            log.info("reconcile pass (%s): %d action(s) applied, %d failed, in %.3fs",
                     trigger, len(result.results), failed, elapsed)
        else:
            log.debug("reconcile pass (%s): no changes, %.3fs", trigger, elapsed)
        self.metrics.reconcile_done(outcome, elapsed)
        self._summary_at = 0.0  # refresh the STATUS line now
        return outcome

    def _count_resets(self, results: tuple[ActionResult, ...]) -> None:
        for r in results:
            if r.ok and r.action.kind in (ActionKind.RESET, ActionKind.RESET_AND_BACKFILL) \
                    and not r.details.get("appliedBefore"):
                trigger = r.action.request.trigger if r.action.request else "unknown"
                self.metrics.resets.labels(r.action.supervisor_id, trigger).inc()

    def _sleep_for(self, leader: bool, next_tick: float, watcher: _SpecWatcher, until_caught_up: bool) -> float:
        # wake up when the next WATCHDOG=1 is due, not a hair before (that would skip a ping)
        ping_due = max(0.02, self._last_ping + self._ping_every - time.monotonic())
        cap = min(ping_due, 0.5 if until_caught_up else 1.0)
        if not leader:
            return min(cap, self.settings.lease_ttl / 5)
        horizon = max(0.02, next_tick - time.monotonic())
        hint = watcher.wait_hint(self.settings.debounce)
        if hint is not None:
            horizon = min(horizon, hint)
        return min(horizon, cap, self.settings.lease_ttl / 5)

    # -- telling the world: STATUS, WATCHDOG, gauges ---------------------------------------

    def _ping(self) -> None:
        now = time.monotonic()
        if now - self._last_ping >= self._ping_every - 0.02:
            self._last_ping = now
            notify.notify("WATCHDOG=1", f"STATUS={self.status_line()}")

    def status_line(self) -> str:
        """The one-line summary systemd shows (``systemctl status``)."""
        if self.lease_token is None:
            return f"standby: leader is {self._leader_seen or 'unknown'}"
        return f"leader (token {self.lease_token}): {self._summary}"

    def _refresh_summary(self) -> None:
        now = time.monotonic()
        if now - self._summary_at < SUMMARY_EVERY:
            return
        self._summary_at = now
        try:
            actual = self.store.read_actual()
        except ReconcilerError:
            return
        states = {sid: str(r.state) for sid, r in actual.supervisors.items()}
        self.metrics.set_states(states, [str(x) for x in State])
        self.metrics.prune_failing(sid for sid, r in actual.supervisors.items() if r.state in RUNNABLE)
        counts = Counter(s for s in states.values() if s != State.TERMINATED)
        text = f"{sum(counts.values())} supervisor(s)"
        if counts:
            text += ": " + ", ".join(f"{n} {st}" for st, n in sorted(counts.items()))
        busy = len(self.manager.running) if self.manager else 0
        if busy:
            text += f"; {busy} batch(es) in flight"
        if self.metrics.failing:
            text += f"; {len(self.metrics.failing)} failing"
        self._summary = text

    # -- --until-caught-up ------------------------------------------------------------------

    def _caught_up(self) -> bool:
        try:
            actual = self.store.read_actual()
        except ReconcilerError as exc:  # e.g. the database connection dropped: ask again next loop
            log.warning("cannot read the state to check catch-up yet: %s", exc)
            return False
        self._note_stuck(actual)  # first: a supervisor whose stream cannot even be asked is stuck too
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
        return not self._pending(actual) and (self.manager is None or self.manager.idle())

    def _pending(self, actual) -> list[str]:
        """What keeps ``--until-caught-up`` waiting, one phrase per supervisor."""
        out = []
        for sid, target in (self._targets or {}).items():
            rec = actual.supervisors.get(sid)
            if rec is None or rec.state not in RUNNABLE:
                continue
            checkpoint = actual.checkpoints.get(sid, {})
            if not caught_up(checkpoint, target):
                lag = sum(max(0, end - checkpoint.get(p, 0)) for p, end in target.items())
                out.append(f"{sid} ({rec.state}, {lag} records behind)")
        out += [f"{sid} ({r.state}, backfill not completed)" for sid, r in sorted(actual.supervisors.items())
                if r.kind == Kind.BACKFILL and r.state not in (State.COMPLETED, State.TERMINATED)]
        return out

    def _pending_text(self) -> str:
        try:
            return ", ".join(self._pending(self.store.read_actual())) or "in-flight batches"
        except ReconcilerError as exc:
            return f"unknown (the database cannot be read: {exc})"

    def _note_stuck(self, actual) -> None:
        """Supervisors UNHEALTHY for longer than the grace period: --until-caught-up gives up on them."""
        now = time.monotonic()
        unhealthy = {sid: r for sid, r in actual.supervisors.items()
                     if r.state in (State.UNHEALTHY_SUPERVISOR, State.UNHEALTHY_TASKS)}
        self._unhealthy_since = {sid: self._unhealthy_since.get(sid, now) for sid in unhealthy}
        self._stuck = [f"{sid} has been {r.state} for {now - self._unhealthy_since[sid]:.0f}s: {r.last_error}"
                       for sid, r in sorted(unhealthy.items()) if now - self._unhealthy_since[sid] >= UNHEALTHY_GRACE]

    def _start_http(self) -> None:
        if not self.settings.http:
            return
        try:
            self._http = serve(self.metrics, self.settings.http, page=self._status_page)
            host, port = self._http.server_address[:2]
            log.info("status page on http://%s:%d/, metrics on /metrics, health on /healthz", host, port)
        except (OSError, ValueError) as exc:
            log.warning("cannot serve metrics on %s: %s (continuing without)", self.settings.http,
                        getattr(exc, "strerror", None) or exc)


    def _status_page(self) -> str:
        """The HTML of ``/`` (served from the HTTP thread: reads only, no broker calls)."""
        from reconciler import statuspage
        from reconciler.status import all_status

        return statuspage.render(all_status(self.store, with_latest=False),
                                 self.store.recent_audit(statuspage.RESET_ACTIONS, limit=20),
                                 self.metrics.health(), self.metrics.lag_by_supervisor())


def _write_stderr(text: str) -> None:
    try:
        os.write(2, text.encode(errors="replace"))
    except OSError:
        pass


def _redacted_url(url: str) -> str:
    from reconciler.spec.secrets import redact_uri

    return redact_uri(url)
