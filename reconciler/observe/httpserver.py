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
* a worker writes the headers, then the body, each with ``sendall`` and a ``SEND_TIMEOUT``
  on the whole write (a page larger than the socket's buffer is sent whole, never cut at
  what one ``send`` took): a client that does not read cannot hold it longer;
* complete requests wait in two queues: ``/healthz`` and ``/metrics`` (``URGENT``) ahead of
  pages, and one worker serves nothing else, so a probe never waits behind pages being
  rendered or sent to clients that do not read (400 of them once held ``/healthz`` for 92 s);
* at most ``MAX_QUEUED`` page requests (four times as many urgent ones) wait for a worker:
  the next one is answered ``503`` with ``Retry-After`` by the selector itself, at once.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

log = logging.getLogger(__name__)

WORKERS = 4
MAX_CONNECTIONS = 256
REQUEST_DEADLINE = 10.0  # seconds from accept to a complete request head
SEND_TIMEOUT = 10.0  # seconds one write of an answer may wait for the client
MAX_HEAD = 16 << 10
MAX_QUEUED = 32  # complete page requests waiting for a worker; more are answered 503 at once
URGENT = ("/healthz", "/metrics")  # paths answered ahead of pages, by a worker of their own


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
        self.wfile = _SendAll(self.connection)

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


class _SendAll(io.RawIOBase):
    """The handler's ``wfile``: each write is one ``sendall``. A raw socket file's ``write`` is
    one ``send``, which takes only what fits in the socket's buffer, and ``http.server``
    ignores the count it returns: a large page reached a slow reader cut short."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._sock.sendall(data)
        return len(data)


def _path(head: bytes) -> str:
    """The path of a request head's first line ("GET /healthz?x HTTP/1.1" -> "/healthz")."""
    parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
    return parts[1].split(b"?", 1)[0].decode("latin-1") if len(parts) >= 2 else ""


def _busy(head: bytes) -> bytes:
    body = b"" if head.startswith(b"HEAD ") else b"busy: too many requests waiting; try again in a second\n"
    return (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Retry-After: 1\r\nCache-Control: no-store\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


class BoundedHTTPServer:
    """Serves ``handler`` (a ``RequestHandler``) on ``(host, port)``; ``serve_forever`` runs
    the selector (``start`` runs it on a daemon thread), ``shutdown`` stops it."""

    def __init__(self, address: tuple[str, int], handler: type[RequestHandler], *, workers: int = WORKERS,
                 max_connections: int = MAX_CONNECTIONS, deadline: float = REQUEST_DEADLINE,
                 max_queued: int = MAX_QUEUED, urgent: tuple[str, ...] = URGENT):
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
        self.max_queued = max_queued
        self.urgent = urgent
        self.shed = 0  # requests answered 503 because their queue was full
        self._queued: dict[bool, deque[tuple[socket.socket, bytes, object]]] = {True: deque(), False: deque()}
        self._cond = threading.Condition()
        self._closed = False
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # the first worker serves URGENT paths only: a probe finds it free whatever pages cost
        self._workers = [threading.Thread(target=self._work, args=(i == 0,), name=f"http-{i}", daemon=True)
                         for i in range(max(2, workers))]
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
                oldest = next(iter(self._waiting))  # the one that waited longest goes, unless
                self._read(sel, oldest)  # its head came meanwhile, unread in a burst of accepts
                if oldest in self._waiting:
                    self._drop(sel, oldest)
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
            self._enqueue(conn, bytes(waiting.data), addr)

    def _enqueue(self, conn: socket.socket, head: bytes, addr: object) -> None:
        urgent = _path(head).startswith(self.urgent)
        with self._cond:
            full = len(self._queued[urgent]) >= self.max_queued * (4 if urgent else 1)
            if not full:
                self._queued[urgent].append((conn, head, addr))
                self._cond.notify_all()
                return
        self.shed += 1
        with contextlib.suppress(OSError):  # a few hundred bytes: the socket's buffer takes them
            conn.send(_busy(head))
        with contextlib.suppress(OSError):
            conn.close()

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

    def _take(self, urgent_only: bool) -> tuple[socket.socket, bytes, object] | None:
        with self._cond:
            while not self._closed:
                if self._queued[True]:
                    return self._queued[True].popleft()
                if not urgent_only and self._queued[False]:
                    return self._queued[False].popleft()
                self._cond.wait()
            return None

    def _work(self, urgent_only: bool) -> None:
        while True:
            item = self._take(urgent_only)
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
        with self._cond:
            self._closed = True
            left = [item[0] for q in self._queued.values() for item in q]
            for q in self._queued.values():
                q.clear()
            self._cond.notify_all()
        for conn in left:
            with contextlib.suppress(OSError):
                conn.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.socket.close()
