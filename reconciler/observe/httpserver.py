"""The HTTP server behind the status page, ``/metrics`` and ``/healthz``: bounded, and deaf
to clients that do not talk.

``http.server.ThreadingHTTPServer`` gives each connection a thread and never times one out,
so 300 idle sockets pinned 302 threads. Here one selector thread accepts every connection
and reads its request head without blocking; only a complete head is handed to one of a
few worker threads, which answers it with the ordinary ``BaseHTTPRequestHandler`` and
closes the connection (HTTP/1.0, one request each). So:

* threads are bounded: the selector and ``WORKERS`` workers, whatever clients do;
* a connection that has not sent its whole request head within ``REQUEST_DEADLINE``
  seconds is closed, as is one whose head exceeds ``MAX_HEAD`` bytes;
* at most ``MAX_CONNECTIONS`` connections wait for their heads: beyond that the one that
  waited longest is closed, so a flood of idle sockets never locks out the next real
  request (``/healthz`` answers beside them);
* a worker writes with a ``SEND_TIMEOUT``: a client that does not read cannot hold it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import selectors
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

log = logging.getLogger(__name__)

WORKERS = 4
MAX_CONNECTIONS = 256
REQUEST_DEADLINE = 10.0  # seconds from accept to a complete request head
SEND_TIMEOUT = 10.0  # seconds one write of an answer may wait for the client
MAX_HEAD = 16 << 10


@dataclass
class _Waiting:
    accepted: float
    data: bytearray = field(default_factory=bytearray)


@dataclass(frozen=True)
class Request:
    """What a worker hands the handler: the connection and the request head already read."""

    sock: socket.socket
    head: bytes


class RequestHandler(BaseHTTPRequestHandler):
    """A ``BaseHTTPRequestHandler`` fed by ``BoundedHTTPServer``; HEAD is GET without the body."""

    def setup(self) -> None:
        request: Request = self.request
        self.connection = request.sock
        self.connection.settimeout(SEND_TIMEOUT)
        self.rfile = io.BytesIO(request.head)
        self.wfile = self.connection.makefile("wb", buffering=0)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.flush()
        self.wfile.close()

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self.do_GET()

    def end_headers(self) -> None:
        super().end_headers()
        if self.command == "HEAD":  # the headers are out; whatever do_GET writes next is dropped
            self.wfile = io.BytesIO()


class BoundedHTTPServer:
    """Serves ``handler`` (a ``RequestHandler``) on ``(host, port)``; ``serve_forever`` runs
    the selector (``start`` runs it on a daemon thread), ``shutdown`` stops it."""

    def __init__(self, address: tuple[str, int], handler: type[RequestHandler], *, workers: int = WORKERS,
                 max_connections: int = MAX_CONNECTIONS, deadline: float = REQUEST_DEADLINE):
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(1024)
            self.socket.setblocking(False)
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self.handler = handler
        self.max_connections = max_connections
        self.deadline = deadline
        self._waiting: OrderedDict[socket.socket, _Waiting] = OrderedDict()
        self._ready: queue.SimpleQueue[tuple[socket.socket, bytes, object] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._workers = [threading.Thread(target=self._work, name=f"http-{i}", daemon=True) for i in range(workers)]
        for t in self._workers:
            t.start()

    def start(self) -> BoundedHTTPServer:
        threading.Thread(target=self.serve_forever, name="http", daemon=True).start()
        return self

    # -- the selector --------------------------------------------------------------------

    def serve_forever(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.socket, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(self._next_expiry()):
                    if key.data == "listen":
                        self._accept(sel)
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 512)
                    else:
                        self._read(sel, key.fileobj)
                self._expire(sel)
        finally:
            for conn in list(self._waiting):
                self._drop(sel, conn)
            sel.close()
            self._stopped.set()

    def _next_expiry(self) -> float:
        if not self._waiting:
            return 1.0
        oldest = next(iter(self._waiting.values())).accepted
        return max(0.0, min(1.0, oldest + self.deadline - time.monotonic()))

    def _accept(self, sel: selectors.BaseSelector) -> None:
        while True:
            try:
                conn, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, for example: drop the oldest waiter
                log.warning("http: cannot accept: %s", exc.strerror or exc)
                if self._waiting:
                    self._drop(sel, next(iter(self._waiting)))
                return
            conn.setblocking(False)
            while len(self._waiting) >= self.max_connections:
                self._drop(sel, next(iter(self._waiting)))  # the one that waited longest
            self._waiting[conn] = _Waiting(time.monotonic())
            sel.register(conn, selectors.EVENT_READ, addr)

    def _read(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        waiting = self._waiting.get(conn)
        if waiting is None:
            return
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk or len(waiting.data) + len(chunk) > MAX_HEAD:
            self._drop(sel, conn)
            return
        waiting.data += chunk
        if b"\r\n\r\n" in waiting.data or b"\n\n" in waiting.data:
            addr = sel.get_key(conn).data
            sel.unregister(conn)
            del self._waiting[conn]
            self._ready.put((conn, bytes(waiting.data), addr))

    def _expire(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self._waiting:
            conn, waiting = next(iter(self._waiting.items()))
            if now - waiting.accepted < self.deadline:
                return
            self._drop(sel, conn)

    def _drop(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        self._waiting.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        with contextlib.suppress(OSError):
            conn.close()

    # -- the workers ---------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._ready.get()
            if item is None:
                return
            conn, head, addr = item
            try:
                conn.setblocking(True)
                self.handler(Request(conn, head), addr, self)
            except Exception:  # noqa: BLE001 - a broken client or a handler's bug: this request only
                log.debug("http: request failed", exc_info=True)
            finally:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    conn.close()

    # -- stopping ------------------------------------------------------------------------

    def shutdown(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._stopped.wait(5)

    def server_close(self) -> None:
        for _ in self._workers:
            self._ready.put(None)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.socket.close()
