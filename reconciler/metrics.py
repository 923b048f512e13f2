"""Prometheus metrics and the ``/healthz`` endpoint (prometheus-client).

``/healthz`` answers 200 while the daemon is healthy and 503 otherwise, as Druid's
supervisor health does: the tick loop must have completed recently and no runnable
supervisor may be failing (e.g. its broker is unreachable).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import MetricsHandler


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.state = Gauge("reconciler_supervisor_state", "1 for the supervisor's current state", ["supervisor", "state"], registry=r)
        self.lag = Gauge("reconciler_partition_lag", "records not yet ingested", ["supervisor", "partition"], registry=r)
        self.checkpoint = Gauge("reconciler_partition_checkpoint", "next offset to ingest", ["supervisor", "partition"], registry=r)
        self.records = Counter("reconciler_records_ingested", "records published", ["supervisor"], registry=r)
        self.unparseable = Counter("reconciler_records_unparseable", "records kept in the dead-letter set", ["supervisor"], registry=r)
        self.batch_seconds = Histogram("reconciler_batch_duration_seconds", "batch duration", ["supervisor"], registry=r,
                                       buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300))
        self.tick_seconds = Histogram("reconciler_tick_duration_seconds", "reconcile pass duration", registry=r,
                                      buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30))
        self.conflicts = Counter("reconciler_publish_conflicts", "publishes that lost their compare-and-swap", ["supervisor"], registry=r)
        self.resets = Counter("reconciler_resets", "reset requests applied", ["supervisor", "kind"], registry=r)
        self.leader = Gauge("reconciler_leader", "1 while this daemon holds the leader lease", registry=r)
        self.failing: dict[str, str] = {}
        self.last_tick = 0.0
        self.max_tick_age = 120.0
        self._lock = threading.Lock()

    def observe_positions(self, supervisor: str, checkpoint: Mapping[str, int], target: Mapping[str, int]) -> None:
        for p, end in target.items():
            cp = checkpoint.get(p)
            if cp is not None:
                self.checkpoint.labels(supervisor, p).set(cp)
                self.lag.labels(supervisor, p).set(max(0, end - cp))

    def batch_done(self, supervisor: str, records: int, unparseable: int, seconds: float) -> None:
        self.records.labels(supervisor).inc(records)
        self.unparseable.labels(supervisor).inc(unparseable)
        self.batch_seconds.labels(supervisor).observe(seconds)

    def publish_conflict(self, supervisor: str) -> None:
        self.conflicts.labels(supervisor).inc()

    def set_states(self, states: Mapping[str, str], all_states: list[str]) -> None:
        for sid, st in states.items():
            for s in all_states:
                self.state.labels(sid, s).set(1 if s == st else 0)

    def set_failing(self, supervisor: str, error: str | None) -> None:
        with self._lock:
            if error:
                self.failing[supervisor] = error
            else:
                self.failing.pop(supervisor, None)

    def health(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            failing = dict(self.failing)
        tick_age = time.monotonic() - self.last_tick if self.last_tick else None
        ok = not failing and tick_age is not None and tick_age < self.max_tick_age
        return ok, {"healthy": ok, "failing": failing, "secondsSinceTick": tick_age}


def serve(metrics: Metrics, address: str) -> ThreadingHTTPServer:
    """Start ``/metrics`` and ``/healthz`` on ``host:port`` in a daemon thread."""
    import json

    host, _, port = address.rpartition(":")
    registry = metrics.registry

    class Handler(MetricsHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path.startswith("/healthz"):
                ok, body = metrics.health()
                data = json.dumps(body, default=str).encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.registry = registry
            super().do_GET()

        def log_message(self, *args):  # access logs would drown the event log
            pass

    Handler.registry = registry
    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
