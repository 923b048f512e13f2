"""The daemon's HTTP endpoint: the status page on ``/``, ``/metrics`` and ``/healthz``.

An address that cannot be listened on fails the daemon's start (``Misconfigured`` naming the
``http`` setting): a supervisor manager whose ``/healthz`` silently is not there looks dead
to every probe, or worse, another process answers on its port. Running without HTTP is a
choice said out loud: ``http: off``. On SIGHUP a new address that cannot be listened on
keeps the daemon running (it is doing its work) on the old address, and says so.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from reconciler.errors import Misconfigured
from reconciler.observe.metrics import Metrics, serve
from reconciler.observe.snapshot import SharedRender
from reconciler.store.store import Store

log = logging.getLogger("reconciler.daemon")  # the name in every line, as before the split


def http_off(address: str) -> bool:
    """Whether the ``http`` setting says to run without the page, /metrics and /healthz
    (``off``; '' as before; YAML's ``http: off`` is read as ``off`` by the settings)."""
    return not address or str(address).strip().lower() == "off"


class HttpEndpoint:
    """The server on the configured address; none when ``http`` is off."""

    def __init__(self, store: Store, metrics: Metrics, freshness=None):
        self.store = store
        self._metrics = metrics
        self._freshness = freshness  # daemon.freshness.Freshness: the lag observer's charts, when leading
        self._server = None
        self._address = ""
        self.pages = SharedRender(self._status_page)  # concurrent requests share one rendering
        self._stored = None  # observe.storedsamples.StoredSamples: the charts' samples when not leading

    def start(self, address: str) -> None:
        """Listen on ``address``; ``Misconfigured`` naming the setting when that is impossible."""
        self._address = address
        if http_off(address):
            log.info("http is off: no status page, /metrics or /healthz")
            return
        try:
            self._server = serve(self._metrics, address, page=self.pages.get)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise Misconfigured(
                f"setting http (--http, RECONCILER_HTTP): cannot listen on {address}: {reason}. The status "
                "page, /metrics and /healthz live there: free the port, choose another address, or set "
                "http: off (--http off, RECONCILER_HTTP=off) to run without them") from exc
        host, port = self._server.server_address[:2]
        log.info("status page on http://%s:%d/, metrics on /metrics, health on /healthz", host, port)

    def switch(self, address: str) -> None:
        """SIGHUP's new address; when it cannot be listened on, the old one is kept."""
        old = self._address
        self.stop()
        try:
            self.start(address)
        except Misconfigured as exc:
            log.error("SIGHUP: %s; keeping %s", exc, "http off" if http_off(old) else old)
            try:
                self.start(old)
            except Misconfigured as again:  # taken meanwhile: the daemon goes on working, unseen
                log.error("SIGHUP: %s", again)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _status_page(self, path: str = "/") -> str | None:
        """The HTML of ``/`` or ``/supervisors/<id>`` (served from the HTTP thread: reads only, no
        broker calls); None for a supervisor that does not exist."""
        from urllib.parse import unquote

        from reconciler.observe import statuspage, supervisorpage
        from reconciler.observe.status import all_status, settle

        observer = self._freshness.observer if self._freshness is not None else None
        seen = observer.snapshot() if observer is not None else {}
        if path.startswith("/supervisors/"):
            sid = unquote(path[len("/supervisors/"):]).strip("/")
            items = all_status(self.store, sid, with_latest=False) if sid else []
            if not items:
                return None
            o = seen.get(sid)
            settle(items[0], lag=o.records if o is not None else None)  # IDLE with records behind is not idle
            return supervisorpage.render(
                items[0], observed=_observed(o, partitions=True), samples=self._samples(observer, [sid]).get(sid, []),
                batches=self.store.recent_batches(sid, supervisorpage.BATCHES_SHOWN),
                audit=list(reversed(self.store.history(sid)))[:50])
        items = all_status(self.store, with_latest=False)
        for item in items:  # the observer's lag is the one known now: IDLE with records behind is not idle
            o = seen.get(item["id"])
            settle(item, lag=o.records if o is not None else None)
        history = self._samples(observer, [i["id"] for i in items])
        return statuspage.render(items, self.store.recent_audit(statuspage.RESET_ACTIONS, limit=20),
                                 self._metrics.health(), self._metrics.lag_by_supervisor(),
                                 observed={sid: _observed(o) for sid, o in seen.items()}, history=history,
                                 webhooks=[w.to_dict() for w in self.store.webhook_cursors()
                                           if self._freshness is None or w.endpoint in self._freshness.endpoints()],
                                 alerts=self.store.recent_audit(statuspage.ALERT_ACTIONS, limit=20))

    def _samples(self, observer, sids: list[str]) -> dict:
        """The charts' samples: the lag observer's when this daemon leads, else the ones the leader
        keeps in the database (a follower's page charts too)."""
        if observer is not None:
            return {sid: observer.history(sid) for sid in sids}
        if self._stored is None:
            from reconciler.observe.storedsamples import StoredSamples

            self._stored = StoredSamples(self.store)
        return self._stored.history(sids, datetime.now(UTC))


def _observed(o, *, partitions: bool = False) -> dict | None:
    """The lag observer's last observation of one supervisor, as the pages read it."""
    if o is None:
        return None
    doc = {"at": o.at, "records": o.records, "seconds": o.seconds, "error": o.error}
    if partitions:
        doc["partitions"] = [{"partition": p.partition, "target": p.target, "records": p.records,
                              "seconds": p.seconds} for p in o.partitions]
    return doc
