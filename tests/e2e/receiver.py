"""A real HTTP server on loopback that receives webhook events (for the freshness tests).

``Receiver()`` records every JSON body POSTed to it, in the order they arrived; ``fail_next``
answers the next N requests with an error status instead; ``hang`` makes it accept requests and
never answer (an endpoint that is down in the worst way: a black hole).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.fail_next = 0
        self.fail_status = 503
        self.hang = False
        self.hanging = 0  # requests held open right now
        self.requests = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.requests += 1
                    hang, fail = receiver.hang, receiver.fail_next > 0
                    if fail:
                        receiver.fail_next -= 1
                if hang:
                    with receiver._lock:
                        receiver.hanging += 1
                    receiver._release.wait(120)
                    with receiver._lock:
                        receiver.hanging -= 1
                    return
                if fail:
                    self.send_response(receiver.fail_status)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.events.append(json.loads(body))
                    receiver.paths.append(self.path)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/s3cr3t-token"

    def wait_for(self, predicate, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                events = list(self.events)
            if predicate(events):
                return events
            time.sleep(0.1)
        raise AssertionError(f"the receiver did not get the expected events within {timeout}s: "
                             f"{[(e['type'], e['supervisor']) for e in self.events]}")

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
