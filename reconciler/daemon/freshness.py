"""The leader's freshness work: the lag observer and the webhook delivery (issue 32).

Both run only while this daemon leads (one observer, one delivery per endpoint across the
daemons), both on threads of their own so that the loop and the reconcile pass never wait on
a broker or an endpoint. ``follow`` is called by the loop after each ``Leadership.hold``: it
starts them when this daemon becomes the leader, stops them when it is deposed (without
waiting: the loop must not wait on a broker or an endpoint), and restarts either when a SIGHUP
changed its setting (``webhook``, ``lagInterval``).

The webhook's cursors are loaded before the first pass of a term (``follow`` runs before
``maybe_reconcile``), so no audit entry of the term is written before its follower knows
where it starts. At shutdown the delivery gets ``webhook.FLUSH`` seconds to send what the
audit log already holds, after the runtimes stopped (the last backfill's completion is in it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from reconciler.errors import ReconcilerError
from reconciler.observe.lagwatch import LagObserver
from reconciler.observe.metrics import Metrics
from reconciler.observe.webhook import FLUSH, WebhookDelivery
from reconciler.settings import Settings
from reconciler.store.store import Store

log = logging.getLogger("reconciler.daemon")


class Freshness:
    def __init__(self, store: Store, settings: Callable[[], Settings], metrics: Metrics,
                 on_due: Callable[[], None]):
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._on_due = on_due
        self.observer: LagObserver | None = None
        self.delivery: WebhookDelivery | None = None
        self._urls: tuple[str, ...] = ()
        self._interval = 0.0

    def follow(self, leader: bool) -> None:
        if not leader:
            self._stop(flush=0.0, wait=False)  # deposed: the new leader delivers from the stored cursors
            return
        s = self._settings()
        if self.observer is not None and self._interval != s.lag_interval:
            self.observer.stop()
            self.observer = None
        if self.observer is None and s.lag_interval > 0:
            self._interval = s.lag_interval
            self.observer = LagObserver(self._store, interval=s.lag_interval, metrics=self._metrics,
                                        on_due=self._on_due)
            self.observer.start()
        if self.delivery is not None and self._urls != s.webhooks:
            self.delivery.stop(flush=FLUSH)
            self.delivery = None
        if self.delivery is None and s.webhooks:
            delivery = WebhookDelivery(self._store, s.webhooks, self._metrics)
            try:
                delivery.start()  # reads (or makes) the cursors: the database must answer
            except ReconcilerError as exc:
                delivery.stop(flush=0.0, wait=False)
                log.warning("webhook: not started yet (%s); trying again", exc)
                return
            self._urls, self.delivery = s.webhooks, delivery
            log.info("webhook: delivering every audit event to %s",
                     ", ".join(e.label for e in delivery.endpoints))

    def endpoints(self) -> set[str]:
        """The keys (URL hashes) of the webhook endpoints this daemon delivers to."""
        delivery = self.delivery
        return {e.key for e in delivery.endpoints} if delivery is not None else set()

    def stop(self) -> None:
        """At shutdown: the observer at once, the delivery after flushing what is written."""
        self._stop(flush=FLUSH)

    def _stop(self, flush: float, *, wait: bool = True) -> None:
        """``wait=False``: signal the threads and go on (the loop must not wait on a broker or an
        endpoint); they leave after the call they are in."""
        if self.observer is not None:
            self.observer.stop(wait=wait)
            self.observer = None
        if self.delivery is not None:
            self.delivery.stop(flush=flush, wait=wait)
            self.delivery = None
