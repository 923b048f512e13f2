"""Leadership: holding and renewing the leader lease, role changes, the heartbeat.

The lease is a row with a fencing token. The runtimes of one term publish with that term's
token, so once another daemon took over (the lease ran out while this one was paused or cut
off), their publishes fail in the database: a deposed leader can no longer publish.

A pass can outlast the lease (the first pass over ten thousand files takes longer than the
default 15 s TTL): the pass renews the lease as the loop does, before each file it loads,
before it reads the database and before each action (``leading_in_pass``), and keeps
``/healthz``, WATCHDOG=1 and the heartbeat fresh while it makes progress. Nothing renews the
lease but this progress: a pass stuck on one call stops renewing, and a standby takes over
within the TTL as from a dead leader. A pass applies an action only while the lease was
renewed under the same token within half the TTL (a token unchanged means held without a
break); once it was lost, or could not be renewed, the rest of the plan is not applied and
the daemon steps down (or, if it took the lease again, starts a new term with a new token)
before anything else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from reconciler.errors import ReconcilerError
from reconciler.observe.metrics import Metrics
from reconciler.pipeline import heap
from reconciler.runtime.manager import RuntimeManager
from reconciler.runtime.recovery import recover
from reconciler.runtime.supervisor import RuntimeContext
from reconciler.settings import Settings
from reconciler.spec.grants import Grants, executor_env
from reconciler.store.store import Store

log = logging.getLogger("reconciler.daemon")  # the name in every line, as before the split

# How long a new term's runtimes wait for its first reconcile pass before stepping anyway:
# the pass applies the markers left while no daemon led (RuntimeManager.start).
FIRST_PASS_WAIT = 10.0


class Leadership:
    """This daemon's role: the lease it holds (``lease_token``, None as a standby), the
    runtimes of its term (``manager``) and who leads when it does not (``leader_seen``).

    ``settings`` is asked at each use, so a SIGHUP's new lease TTL applies at once;
    ``ping`` is the loop's WATCHDOG=1, sent while a long pass makes progress; ``wake``
    rings the loop's bell when a runtime published a batch or finished."""

    def __init__(self, store: Store, settings: Callable[[], Settings], holder: str, metrics: Metrics,
                 ping: Callable[[], None], wake: Callable[[], None] | None = None):
        self.store = store
        self._settings = settings
        self.holder = holder
        self._metrics = metrics
        self._ping = ping
        self._wake = wake
        self.lease_token: int | None = None
        self.manager: RuntimeManager | None = None
        self.leader_seen: str | None = None
        self._checked = 0.0
        self._renewed = 0.0
        self._lost_in_pass = False
        self._beat: tuple[str, float] = ("", 0.0)
        self._spark_lock = threading.Lock()

    def hold(self) -> bool:
        """Take or renew the lease (at most every min(1s, ttl/5)); True while we lead."""
        now = time.monotonic()
        ttl = self._settings().lease_ttl
        if now - self._checked < min(1.0, ttl / 5):
            return self.lease_token is not None
        self._checked = now
        try:
            token = self.store.acquire_lease(self.holder, ttl)
            self._metrics.database_error = None
        except ReconcilerError as exc:
            self._metrics.database_error = str(exc)
            if self.lease_token is not None and now - self._renewed < ttl:
                log.warning("cannot renew the leader lease (%s); leading until it would expire", exc)
                return True
            log.warning("cannot reach the database for the lease: %s", exc)
            token = None
        if token is not None:
            self._renewed = now
        if token != self.lease_token:
            self._change_role(token)
            if self.lease_token is not None:
                self._checked = 0.0  # taking over (recovery) took a while: renew at the first chance
        if self.lease_token is None:
            self._note_standby()
            if self._metrics.role != "standby":  # started as a standby
                self._metrics.set_role("standby")
        self._heartbeat()
        return self.lease_token is not None

    def begin_pass(self) -> None:
        """A new pass may apply actions again: a loss in the last one was settled by ``hold``."""
        self._lost_in_pass = False

    def settle_soon(self) -> None:
        """Renew or step down at the loop's next ``hold``, without waiting for the interval."""
        self._checked = 0.0

    def leading_in_pass(self) -> bool:
        """The pass's ``leading`` (see ``reconcile_once``): renew the lease when due, as the loop
        does, and show the loop's signs of life while a long pass makes progress. True while
        the lease is held under this term's token and was renewed within half the TTL."""
        token = self.lease_token
        if token is None or self._lost_in_pass:
            return False
        now = time.monotonic()
        ttl = self._settings().lease_ttl
        if now - self._checked >= min(1.0, ttl / 5):
            self._checked = now
            try:
                renewed = self.store.acquire_lease(self.holder, ttl)
                self._metrics.database_error = None
            except ReconcilerError as exc:
                self._metrics.database_error = str(exc)
                log.warning("cannot renew the leader lease during a reconcile pass: %s", exc)
            else:
                if renewed != token:  # another holds it, or it ran out and we took it again: a new term
                    self._lost_in_pass = True
                    self._checked = 0.0  # the loop settles the role before anything else
                    log.error("leader lease (token %d) lost during a reconcile pass; nothing more is applied",
                              token)
                    return False
                self._renewed = now
            self._heartbeat()
            self._metrics.loop_alive()
            self._ping()
        return time.monotonic() - self._renewed < ttl / 2

    def _change_role(self, token: int | None) -> None:
        if self.lease_token is not None:
            log.error("leader lease lost (token %d); stopping runtimes: their publishes are fenced", self.lease_token)
            self.stop_runtimes(wait=False)
            # Who holds it, before the token goes: the status line (read from other threads)
            # names the leader from the moment it says standby, never "unknown". Taken again
            # by this daemon (it ran out unseen), it is this one, starting a new term.
            if token is None:
                self._note_standby()
            else:
                self.leader_seen = self.holder
            self.lease_token = None
        if token is not None:
            try:
                self._become_leader(token)
            except ReconcilerError as exc:
                log.error("cannot start leading (will retry): %s", exc)
                token = None
        self.lease_token = token
        if token is not None:  # after the token: a reader never sees neither
            self.leader_seen = None
        self._metrics.set_role("leader" if token is not None else "standby")

    def _become_leader(self, token: int) -> None:
        previous = self.leader_seen
        settings = self._settings()
        recover(self.store, settings.warehouse, settings.catalog)
        holder = self.holder
        # This term's runtimes publish with this term's token: after a takeover they are fenced.
        ctx = RuntimeContext(store=self.store, segments_dir=settings.warehouse, spark=self._spark,
                             lease=lambda: (holder, token), metrics=self._metrics,
                             snapshots_kept=settings.snapshots_kept, reader_grace=settings.reader_grace,
                             catalog=settings.catalog)
        self.manager = RuntimeManager(ctx, compact_every=settings.compact_interval,
                                      compact_lateness=settings.compact_lateness,
                                      maintain_every=settings.maintain_interval,
                                      snapshot_retention=settings.snapshot_retention,
                                      rolling_every=settings.rolling_compaction,
                                      on_progress=self._progressed,
                                      step_timeout=lambda: self._settings().step_timeout,
                                      held_for=FIRST_PASS_WAIT)
        self.manager.start()
        log.info("leader: lease taken (token %d)%s", token,
                 f", {previous}'s lease having run out" if previous and previous != holder else "")

    def pass_ended(self) -> None:
        """A reconcile pass concluded (or was fenced): the term's runtimes, held for
        its first pass (``RuntimeManager.start``), may step."""
        manager = self.manager
        if manager is not None:
            manager.open()

    def first_pass_due(self) -> bool:
        """True while this term's runtimes wait for its first pass: the pass is due now."""
        manager = self.manager
        return manager is not None and manager.held()

    def _progressed(self) -> None:
        """A batch published (or a backfill done): the daemon's wake, and the first time, the
        heap settled (``heap``)."""
        heap.settle()
        if self._wake is not None:
            self._wake()

    def settings_changed(self) -> None:
        """After a SIGHUP: this term's compactor takes the new ``compactInterval``,
        ``compactLateness``, ``maintainInterval``, ``snapshotRetention`` and
        ``rollingCompaction`` (a standby's next
        term reads them when it starts; the rest is asked for at each use)."""
        manager = self.manager
        if manager is not None:
            s = self._settings()
            manager.compactor.configure(every=s.compact_interval, lateness=s.compact_lateness,
                                        maintain_every=s.maintain_interval,
                                        snapshot_retention=s.snapshot_retention,
                                        rolling_every=s.rolling_compaction)

    def _note_standby(self) -> None:
        try:
            lease = self.store.lease()
            holder = lease.holder if lease is not None else "nobody"
        except ReconcilerError:
            holder = "unknown (database unreachable)"
        if holder != self.leader_seen:
            log.info("standby: %s holds the leader lease; taking over if it is not renewed for %gs",
                     holder, self._settings().lease_ttl)
            self.leader_seen = holder

    def _heartbeat(self) -> None:
        role = "leader" if self.lease_token is not None else "standby"
        now = time.monotonic()
        ttl = self._settings().lease_ttl
        if self._beat[0] == role and now - self._beat[1] < ttl / 3:
            return
        try:
            self.store.heartbeat(self.holder, role, ttl)
            self._beat = (role, now)
        except ReconcilerError:  # the database is away: the next loop beats again (status shows it stale)
            pass

    def stop_runtimes(self, *, wait: bool) -> None:
        if self.manager is not None:
            self.manager.stop(wait=wait)
            self.manager = None

    def release(self) -> None:
        """At shutdown: give the lease up (a standby need not wait for the TTL) and leave the daemon list."""
        try:
            if self.lease_token is not None:
                self.store.release_lease(self.holder)
            self.store.forget_daemon(self.holder)
        except ReconcilerError as exc:
            log.warning("could not release the lease (it expires by itself): %s", exc)

    def _spark(self):
        from reconciler.pipeline.spark import get_session

        with self._spark_lock:
            settings = self._settings()
            conf = dict(settings.spark_conf)
            if not settings.spark_master.startswith("sc://"):  # a Connect server's workers are its own
                conf = {**executor_env(Grants.from_settings(settings)), **conf}
            return get_session(settings.spark_master, conf=conf, shared_dir=settings.warehouse)
