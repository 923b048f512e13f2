"""A webhook receiver on loopback that answers with raw bytes (issue 41): a garbled status line,
more than 100 header lines, a redirect, terminal escapes in the reason phrase, or a slow
trickle of header bytes, none of which ``http.server`` would send.

``RawServer(answer)`` reads each request whole (headers and ``Content-Length`` body), records
it, then calls ``answer(conn)`` to write whatever it likes; ``answer`` may be swapped at any
time. Every connection is closed after its answer, and all of them at ``close()``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

Answer = Callable[[socket.socket], None]


def send(payload: bytes) -> Answer:
    return lambda conn: conn.sendall(payload)


NO_CONTENT = send(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")


def trickle(payload: bytes, every: float) -> Answer:
    """One byte of ``payload`` every ``every`` seconds (a receiver holding the POST open)."""
    def answer(conn: socket.socket) -> None:
        for i in range(len(payload)):
            try:
                conn.sendall(payload[i:i + 1])
            except OSError:  # the client gave up on us
                return
            time.sleep(every)
    return answer


class RawServer:
    def __init__(self, answer: Answer = NO_CONTENT) -> None:
        self.answer = answer
        self.requests: list[bytes] = []  # each request's head (request line and headers)
        self.cut_after: list[float] = []  # seconds from a request to the client closing on us
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str = "/hooks/s3cr3t-token") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
            except OSError:
                return
            with self._lock:
                self.requests.append(head)
            started = time.monotonic()
            self.answer(conn)
            try:  # how long until the client hangs up (a cut connection reads as EOF or a reset)
                conn.settimeout(30)
                while conn.recv(1024):
                    pass
            except OSError:
                pass
            with self._lock:
                self.cut_after.append(time.monotonic() - started)

    def close(self) -> None:
        self._sock.close()
        with self._lock:
            for c in self._conns:
                try:
                    c.close()
                except OSError:
                    pass
