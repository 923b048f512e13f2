"""/healthz behind a burst of /metrics (review of 050bd93 / 201070e): it shared its queue and its "own" worker.

``/metrics`` is rendered anew for every request (no SharedRender) and its cost grows with
the supervisors (100 supervisors of 8 partitions: ~0.9 MB, tens of ms of CPU each). A burst
of ``GET /metrics`` (one scraper retrying, or anyone who can reach the port) fills the
urgent queue: /healthz waits FIFO behind every queued /metrics rendering, and once 128 wait
the selector answers /healthz itself with 503. A liveness probe then restarts a healthy
leader. The claim was "/healthz answered ahead of pages by a worker of its own".
"""

from __future__ import annotations

import http.client
import socket
import time

import pytest

from reconciler.observe.metrics import Metrics, serve


def _metrics(supervisors: int) -> Metrics:
    m = Metrics()
    m.loop_alive()
    for i in range(supervisors):
        sid = f"team-a-orders-{i:03d}"
        m.observe_positions(sid, {str(p): 100 for p in range(8)}, {str(p): 200 for p in range(8)})
        m.batch_done(sid, 1000, 0, 1.5, {"read": 0.5, "parse": 0.2, "write": 0.6, "commit": 0.2})
    return m


@pytest.mark.parametrize("burst", [100, 200])  # 100: under the urgent queue's 128 (waits); 200: over (shed)
def test_a_burst_of_metrics_requests_neither_holds_nor_sheds_healthz(burst):
    srv = serve(_metrics(100), "127.0.0.1:0", page=lambda path: "<p>page</p>")
    port = srv.server_address[1]
    clients = []
    try:
        for _ in range(burst):  # complete heads, never read (a small receive window)
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            c.settimeout(20)
            c.connect(("127.0.0.1", port))
            c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            clients.append(c)
        time.sleep(0.2)  # every head read by the selector
        started = time.monotonic()
        probe = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        probe.request("GET", "/healthz")
        status = probe.getresponse().status
        took = time.monotonic() - started
        probe.close()
        assert (status, took < 2.0) == (200, True), f"/healthz answered {status} after {took:.1f}s (shed={srv.shed})"
    finally:
        for c in clients:
            c.close()
        srv.shutdown()
        srv.server_close()
