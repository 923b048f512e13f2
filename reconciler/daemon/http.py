"""The daemon's HTTP endpoint: the status page on ``/``, ``/metrics`` and ``/healthz``."""

from __future__ import annotations

import logging

from reconciler.observe.metrics import Metrics, serve
from reconciler.store.store import Store

log = logging.getLogger("reconciler.daemon")  # the name in every line, as before the split


class HttpEndpoint:
    """The server on the configured address; none when the address is empty or unusable
    (the daemon goes on without it: it is a window onto the daemon, not part of its work)."""

    def __init__(self, store: Store, metrics: Metrics):
        self.store = store
        self._metrics = metrics
        self._server = None

    def start(self, address: str) -> None:
        if not address:
            return
        try:
            self._server = serve(self._metrics, address, page=self._status_page)
            host, port = self._server.server_address[:2]
            log.info("status page on http://%s:%d/, metrics on /metrics, health on /healthz", host, port)
        except (OSError, ValueError) as exc:
            log.warning("cannot serve metrics on %s: %s (continuing without)", address,
                        getattr(exc, "strerror", None) or exc)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _status_page(self) -> str:
        """The HTML of ``/`` (served from the HTTP thread: reads only, no broker calls)."""
        from reconciler.observe import statuspage
        from reconciler.observe.status import all_status

        return statuspage.render(all_status(self.store, with_latest=False),
                                 self.store.recent_audit(statuspage.RESET_ACTIONS, limit=20),
                                 self._metrics.health(), self._metrics.lag_by_supervisor())
