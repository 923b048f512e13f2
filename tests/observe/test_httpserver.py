"""The daemon's HTTP server: idle sockets pin no threads and lock nobody out; HEAD answers (issue 29)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.request

import pytest

from reconciler.observe import httpserver
from reconciler.observe.metrics import Metrics, serve


@pytest.fixture
def server():
    metrics = Metrics()
    metrics.loop_alive()
    srv = serve(metrics, "127.0.0.1:0", page=lambda path: "<!doctype html><p>page</p>")
    yield srv
    srv.shutdown()
    srv.server_close()


def _get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_300_idle_connections_pin_no_threads_and_healthz_still_answers(server):
    port = server.server_address[1]
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]
    try:
        time.sleep(0.5)  # every one accepted by now
        status, _, body = _get(port, "/healthz")
        assert status == 200 and json.loads(body)["healthy"] is True
        assert _get(port, "/")[0] == 200
        # ThreadingHTTPServer held one thread per socket (302 here); the bounded server none
        assert threading.active_count() <= before + 2, threading.active_count()
    finally:
        for s in idle:
            s.close()


def test_head_answers_like_get_without_a_body(server):
    port = server.server_address[1]
    for path in ("/healthz", "/metrics", "/"):
        get_status, get_headers, get_body = _get(port, path)
        head_status, head_headers, head_body = _get(port, path, "HEAD")
        assert (head_status, head_body) == (get_status, b""), path
        assert head_headers.get("Content-Type") == get_headers.get("Content-Type"), path
        assert get_body, path


def test_a_connection_that_says_nothing_is_closed_after_the_deadline(monkeypatch):
    monkeypatch.setattr(httpserver, "REQUEST_DEADLINE", 0.3)
    srv = httpserver.BoundedHTTPServer(("127.0.0.1", 0), httpserver.RequestHandler, deadline=0.3).start()
    try:
        quiet = socket.create_connection(srv.server_address, timeout=5)
        slow = socket.create_connection(srv.server_address, timeout=5)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a head never finished (slowloris)
        assert quiet.recv(1) == b"" and slow.recv(1) == b"", "closed by the server"
    finally:
        srv.shutdown()
        srv.server_close()


def test_beyond_the_cap_the_longest_waiting_connection_goes():
    srv = httpserver.BoundedHTTPServer(("127.0.0.1", 0), httpserver.RequestHandler, max_connections=8).start()
    try:
        first = socket.create_connection(srv.server_address, timeout=5)
        time.sleep(0.2)
        later = [socket.create_connection(srv.server_address, timeout=5) for _ in range(8)]
        assert first.recv(1) == b"", "the oldest idle connection made room"
        for s in later:
            s.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_urllib_sees_the_same_health_as_before(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/healthz", timeout=5) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "application/json"


# -- issue 41.3: complete requests that nobody reads ---------------------------------------


def _status_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        line += chunk
    return line


def test_400_unread_page_requests_neither_hold_healthz_nor_queue_without_bound():
    """400 complete ``GET /`` of a 0.5 MB page, sent at once and never read: /healthz and
    /metrics still answer at once, and the page requests beyond the queue's bound get 503."""
    renders = []

    def page(path: str) -> str:
        renders.append(path)
        time.sleep(0.02)
        return "<!doctype html>" + "x" * 500_000

    metrics = Metrics()
    metrics.loop_alive()
    srv = serve(metrics, "127.0.0.1:0", page=page)
    port = srv.server_address[1]
    clients = []
    try:
        for _ in range(400):
            c = socket.create_connection(("127.0.0.1", port), timeout=20)
            c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            clients.append(c)
        time.sleep(0.3)  # every head read by the selector
        for path in ("/healthz", "/metrics", "/healthz"):
            started = time.monotonic()
            status, _, body = _get(port, path)
            took = time.monotonic() - started
            assert status == 200 and body, path
            assert took < 2.0, f"{path} answered after {took:.1f}s behind unread pages"
        # the page workers render while the heads arrive, MAX_QUEUED wait, and the rest were
        # answered 503 at once rather than queued
        statuses = [_status_line(c).split(b" ")[1:2] for c in clients]
        busy = statuses.count([b"503"])
        assert busy == srv.shed and busy >= 200, (busy, len(renders))
        assert statuses.count([b"200"]) == 400 - busy == len(renders)
    finally:
        for c in clients:
            c.close()
        srv.shutdown()
        srv.server_close()


def test_a_shed_request_is_told_to_retry(server, monkeypatch):
    monkeypatch.setattr(server, "max_queued", 0)
    status, headers, body = _get(server.server_address[1], "/")
    assert (status, headers["Retry-After"]) == (503, "1") and b"busy" in body
    status, headers, body = _get(server.server_address[1], "/", "HEAD")
    assert (status, body) == (503, b"")
    assert server.shed == 2


def test_a_page_larger_than_the_socket_buffer_reaches_a_slow_reader_whole():
    """One ``send`` takes what fits in the socket's buffer; the page used to be cut there."""
    metrics = Metrics()
    page = "<!doctype html>" + "y" * 8_000_000
    srv = serve(metrics, "127.0.0.1:0", page=lambda path: page)
    try:
        c = socket.create_connection(srv.server_address, timeout=20)
        c.sendall(b"GET / HTTP/1.0\r\n\r\n")
        time.sleep(1.0)  # the reader is slow: the buffers fill first
        data = bytearray()
        while chunk := c.recv(1 << 20):
            data += chunk
        c.close()
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        assert f"Content-Length: {len(page)}".encode() in head
        assert len(body) == len(page)
    finally:
        srv.shutdown()
        srv.server_close()


def test_clients_that_do_not_read_hold_no_worker():
    """Ten 8 MB pages to clients that never read, one page worker: the next reader is
    answered at once (a worker writing with ``sendall`` was held ``SEND_TIMEOUT`` by each)."""
    metrics = Metrics()
    page = "<!doctype html>" + "y" * 8_000_000
    srv = serve(metrics, "127.0.0.1:0", page=lambda path: page)
    port = srv.server_address[1]
    clients = []
    try:
        for _ in range(10):
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            c.connect(("127.0.0.1", port))
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            clients.append(c)
        time.sleep(0.5)
        started = time.monotonic()
        status, _, body = _get(port, "/")
        took = time.monotonic() - started
        assert (status, len(body), took < 3.0) == (200, len(page), True), took
    finally:
        for c in clients:
            c.close()
        srv.shutdown()
        srv.server_close()


def test_a_client_that_does_not_read_is_dropped_after_the_send_timeout():
    srv = serve(Metrics(), "127.0.0.1:0", page=lambda path: "<!doctype html>" + "y" * 8_000_000)
    srv.send_timeout = 0.5
    try:
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        c.connect(srv.server_address)
        c.sendall(b"GET / HTTP/1.0\r\n\r\n")
        time.sleep(1.5)  # past the deadline: the rest of the answer goes with the connection
        c.settimeout(10)
        got = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk := c.recv(1 << 20):
                got += len(chunk)
        assert got < 8_000_000
        c.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_metrics_requests_together_share_one_rendering(monkeypatch):
    from reconciler.observe import metrics as metrics_module

    renders = []

    def counted(registry):
        renders.append(1)
        time.sleep(0.3)  # long enough for every request to arrive while it runs
        return real(registry)

    real = metrics_module.generate_latest
    monkeypatch.setattr(metrics_module, "generate_latest", counted)
    srv = serve(Metrics(), "127.0.0.1:0")
    port = srv.server_address[1]
    try:
        results = []
        threads = [threading.Thread(target=lambda: results.append(_get(port, "/metrics")[0])) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert (results, len(renders)) == ([200] * 20, 1)
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("address", ["127.0.0.1:8²", "127.0.0.1:٣٤", ":①"])
def test_a_port_of_non_ascii_digits_is_a_setting_error_not_a_traceback(address):
    """``"²".isdigit()`` is true and ``int("²")`` raises: the check took it, the daemon's start did not."""
    from reconciler.errors import PermanentError
    from reconciler.settings import check_http

    with pytest.raises(PermanentError, match="is not HOST:PORT with a port number"):
        check_http(address)
