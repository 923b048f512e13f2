"""The HTTP server behind the status page, ``/metrics`` and ``/healthz``: bounded, and deaf
to clients that do not talk or do not read.

``http.server.ThreadingHTTPServer`` gives each connection a thread and never times one out,
so 300 idle sockets pinned 302 threads. Here one selector thread accepts every connection,
reads its request head and writes its answer without blocking; in between, a complete head
is handed to one of a few worker threads, which builds the answer with the ordinary
``BaseHTTPRequestHandler`` into memory and hands it back (HTTP/1.0, one request each). So:

* threads are bounded: the selector and ``WORKERS`` workers, whatever clients do;
* a connection that has not sent its whole request head within ``REQUEST_DEADLINE``
  seconds is closed, as is one whose head exceeds ``MAX_HEAD`` bytes;
* at most ``MAX_CONNECTIONS`` connections wait for their heads: beyond that the one that
  waited longest is closed, so a flood of idle sockets never locks out the next real
  request (``/healthz`` answers beside them);
* no worker ever writes to a client: the selector sends each answer as the client takes it,
  whole (never cut at what one ``send`` took), and closes a connection whose answer is not
  taken within ``SEND_TIMEOUT`` seconds; answers being sent hold at most ``MAX_PENDING``
  bytes together, beyond which the one that waited longest is closed. A client that does
  not read holds no thread (400 unread pages once held ``/healthz`` for 92 s, and 100 unread
  ``/metrics`` 22 s);
* complete requests wait in three queues, each with a worker of its own: ``/healthz`` (tiny,
  computed from state in memory: never shed, and behind no page or ``/metrics``),
  ``/metrics`` (at most ``MAX_QUEUED_METRICS`` waiting) and pages (at most ``MAX_QUEUED``);
  the other workers serve pages, then ``/metrics``. A request beyond its queue's bound is
  answered ``503`` with ``Retry-After`` by the selector itself, at once.
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
SEND_TIMEOUT = 10.0  # seconds from an answer's hand-over to the client having taken all of it
MAX_HEAD = 16 << 10
MAX_QUEUED = 32  # complete page requests waiting for a worker; more are answered 503 at once
MAX_QUEUED_METRICS = 128  # the same for /metrics (rendered once a second for all, cheap to answer)
MAX_PENDING = 64 << 20  # bytes of answers handed over and not yet taken by their clients, together
HEALTH, METRICS, PAGE = "health", "metrics", "page"  # the queues
_WRITE = object()  # the selector key's data of a connection being answered


@dataclass
class _Waiting:
    accepted: float
    data: bytearray = field(default_factory=bytearray)


@dataclass
class _Writing:
    deadline: float
    chunks: deque[memoryview]
    size: int


class Answer(io.RawIOBase):
    """The handler's ``wfile``: what it writes is kept (the bytes themselves, not a copy: a
    shared rendering is not copied per request) for the selector to send."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.chunks.append(data if isinstance(data, bytes) else bytes(data))
        return len(self.chunks[-1])


@dataclass(frozen=True)
class Request:
    """What a worker hands the handler: the connection, the request head already read, and
    where the answer goes."""

    sock: socket.socket
    head: bytes
    answer: Answer = field(default_factory=Answer)


class RequestHandler(BaseHTTPRequestHandler):
    """A ``BaseHTTPRequestHandler`` fed by ``BoundedHTTPServer``; HEAD is GET without the body."""

    def setup(self) -> None:
        request: Request = self.request
        self.connection = request.sock  # never read or written here: the selector does that
        self.rfile = io.BytesIO(request.head)
        self.wfile = request.answer

    def finish(self) -> None:
        pass

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self.do_GET()

    def end_headers(self) -> None:
        super().end_headers()
        if self.command == "HEAD":  # the headers are out; whatever do_GET writes next is dropped
            self.wfile = io.BytesIO()


def _path(head: bytes) -> str:
    """The path of a request head's first line ("GET /healthz?x HTTP/1.1" -> "/healthz")."""
    parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
    return parts[1].split(b"?", 1)[0].decode("latin-1") if len(parts) >= 2 else ""


def queue_of(head: bytes) -> str:
    """Which queue a request waits in (the paths as the handler in ``metrics.serve`` reads them)."""
    path = _path(head)
    return HEALTH if path.startswith("/healthz") else METRICS if path.startswith("/metrics") else PAGE


def _busy(head: bytes) -> bytes:
    body = b"" if head.startswith(b"HEAD ") else b"busy: too many requests waiting; try again in a second\n"
    return (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Retry-After: 1\r\nCache-Control: no-store\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def _close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        conn.close()


class BoundedHTTPServer:
    """Serves ``handler`` (a ``RequestHandler``) on ``(host, port)``; ``serve_forever`` runs
    the selector (``start`` runs it on a daemon thread), ``shutdown`` stops it."""

    def __init__(self, address: tuple[str, int], handler: type[RequestHandler], *, workers: int = WORKERS,
                 max_connections: int = MAX_CONNECTIONS, deadline: float = REQUEST_DEADLINE,
                 max_queued: int = MAX_QUEUED, max_queued_metrics: int = MAX_QUEUED_METRICS,
                 send_timeout: float = SEND_TIMEOUT, max_pending: int = MAX_PENDING):
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
        self.send_timeout = send_timeout
        self.max_pending = max_pending
        self._waiting: OrderedDict[socket.socket, _Waiting] = OrderedDict()
        self._writing: OrderedDict[socket.socket, _Writing] = OrderedDict()
        self._pending = 0  # bytes of self._writing not yet sent
        self.max_queued = max_queued
        self.max_queued_metrics = max_queued_metrics
        self.shed = 0  # requests answered 503 because their queue was full
        self._queued: dict[str, deque[tuple[socket.socket, bytes, object]]] = {
            HEALTH: deque(), METRICS: deque(), PAGE: deque()}
        self._cond = threading.Condition()
        self._closed = False
        self._outbox: deque[tuple[socket.socket, list[bytes]]] = deque()  # answers built, to be sent
        self._outbox_lock = threading.Lock()
        self._selecting = True
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # /healthz and /metrics each have a worker of their own: neither waits behind the other or pages
        serves = [(HEALTH,), (METRICS,)] + [(PAGE, METRICS)] * max(1, workers - 2)
        self._workers = [threading.Thread(target=self._work, args=(queues,), name=f"http-{i}", daemon=True)
                         for i, queues in enumerate(serves)]
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
                        self._take_answers(sel)
                    elif key.data is _WRITE:
                        self._send(sel, key.fileobj)
                    else:
                        self._read(sel, key.fileobj)
                self._expire(sel)
        finally:
            with self._outbox_lock:
                self._selecting = False
                left = [conn for conn, _ in self._outbox]
                self._outbox.clear()
            for conn in left + list(self._waiting) + list(self._writing):
                self._drop(sel, conn)
            sel.close()
            self._stopped.set()

    def _next_expiry(self) -> float:
        due = [next(iter(self._waiting.values())).accepted + self.deadline] if self._waiting else []
        due += [next(iter(self._writing.values())).deadline] if self._writing else []
        return max(0.0, min(1.0, min(due) - time.monotonic())) if due else 1.0

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
        queue = queue_of(head)
        bound = {HEALTH: None, METRICS: self.max_queued_metrics, PAGE: self.max_queued}[queue]
        with self._cond:
            if bound is None or len(self._queued[queue]) < bound:
                self._queued[queue].append((conn, head, addr))
                self._cond.notify_all()
                return
        self.shed += 1
        with contextlib.suppress(OSError):  # a few hundred bytes: the socket's buffer takes them
            conn.send(_busy(head))
        _close(conn)

    def _take_answers(self, sel: selectors.BaseSelector) -> None:
        while True:
            with self._outbox_lock:
                if not self._outbox:
                    return
                conn, chunks = self._outbox.popleft()
            views = deque(memoryview(c) for c in chunks if c)
            size = sum(len(v) for v in views)
            self._writing[conn] = _Writing(time.monotonic() + self.send_timeout, views, size)
            self._pending += size
            sel.register(conn, selectors.EVENT_WRITE, _WRITE)
            self._send(sel, conn)
            while self._pending > self.max_pending and len(self._writing) > 1:
                self._drop(sel, next(iter(self._writing)))  # the one that waited longest goes

    def _send(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        writing = self._writing.get(conn)
        if writing is None:
            return
        while writing.chunks:
            view = writing.chunks[0]
            try:
                sent = conn.send(view)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the client went away
                self._drop(sel, conn)
                return
            writing.size -= sent
            self._pending -= sent
            if sent == len(view):
                writing.chunks.popleft()
            else:
                writing.chunks[0] = view[sent:]
        self._drop(sel, conn)  # all of it is in the socket's buffer: the kernel sends the rest

    def _expire(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self._waiting:
            conn, waiting = next(iter(self._waiting.items()))
            if now - waiting.accepted < self.deadline:
                break
            self._drop(sel, conn)
        while self._writing:
            conn, writing = next(iter(self._writing.items()))
            if now < writing.deadline:
                break
            self._drop(sel, conn)

    def _drop(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        self._waiting.pop(conn, None)
        writing = self._writing.pop(conn, None)
        if writing is not None:
            self._pending -= writing.size
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        _close(conn)

    # -- the workers ---------------------------------------------------------------------

    def _take(self, queues: tuple[str, ...]) -> tuple[socket.socket, bytes, object] | None:
        with self._cond:
            while not self._closed:
                for queue in queues:
                    if self._queued[queue]:
                        return self._queued[queue].popleft()
                self._cond.wait()
            return None

    def _work(self, queues: tuple[str, ...]) -> None:
        while True:
            item = self._take(queues)
            if item is None:
                return
            conn, head, addr = item
            request = Request(conn, head)
            try:
                self.handler(request, addr, self)
            except Exception:  # noqa: BLE001 - a broken request or a handler's bug: this request only
                log.debug("http: request failed", exc_info=True)
                _close(conn)
                continue
            self._hand_over(conn, request.answer.chunks)

    def _hand_over(self, conn: socket.socket, chunks: list[bytes]) -> None:
        with self._outbox_lock:
            if self._selecting:
                self._outbox.append((conn, chunks))
                with contextlib.suppress(OSError):  # a full pipe already wakes the selector
                    os.write(self._wake_w, b"x")
                return
        _close(conn)

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
            _close(conn)
        with self._outbox_lock:
            self._selecting = False
            left = [conn for conn, _ in self._outbox]
            self._outbox.clear()
        for conn in left:
            _close(conn)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.socket.close()
