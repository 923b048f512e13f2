"""Prometheus metrics and the ``/healthz`` endpoint (prometheus-client).

The daemon always keeps a ``Metrics`` object (tests read it in process); the HTTP
server is started only when the ``http`` setting names an address.

Metrics (counters carry the ``_total`` suffix in the exposition):

=========================================  =====================  =====================================
name                                       labels                 what
=========================================  =====================  =====================================
``reconciler_supervisor_state``            supervisor, state      1 for the current state, else 0
``reconciler_partition_lag``               supervisor, partition  records between checkpoint and target
``reconciler_partition_checkpoint``        supervisor, partition  the next offset to ingest
``reconciler_records_ingested``            supervisor             records published (incl. unparseable)
``reconciler_records_unparseable``         supervisor             records kept as dead letters
``reconciler_batch_duration_seconds``      supervisor             histogram: read, write, publish
``reconciler_batch_phase_seconds``         supervisor, phase      histogram: capture, plan (+ session start), job, publish
``reconciler_tick_duration_seconds``       (none)                 histogram: one reconcile pass
``reconciler_reconcile_passes``            outcome                changed, unchanged, deferred, aborted
``reconciler_publish_conflicts``           supervisor             publishes that lost the CAS (fenced)
``reconciler_resets``                      supervisor, trigger    resets applied by this daemon
``reconciler_leader``                      (none)                 1 while this daemon holds the lease
``reconciler_records_lost``                supervisor             records the broker deleted before ingestion
``reconciler_lag_seconds``                 supervisor, partition  age of the oldest record not yet ingested
``reconciler_lag_policy_breach``           supervisor             1 while a lag policy's breach has held for ``for``
``reconciler_webhook_delivered``           endpoint               events the endpoint accepted
``reconciler_webhook_failures``            endpoint               failed delivery attempts (retried with backoff)
``reconciler_webhook_dropped``             endpoint               events the endpoint refused for good (HTTP 4xx)
``reconciler_webhook_failing``             endpoint               1 while the endpoint's last attempt failed
``reconciler_webhook_pending``             endpoint               audit entries not delivered yet
=========================================  =====================  =====================================

The lag gauges are set by the leader's lag observer (``lagwatch``) every ``lagInterval``
seconds, and the record lag also by each runtime when it cuts a batch; a webhook's
``endpoint`` label is its scheme, host and port and a short hash of the URL (the URL itself
may hold a secret token).

``/healthz`` answers 200 while the daemon is healthy and 503 otherwise, as Druid's
supervisor health does. Healthy means: the daemon's loop went round recently (a hung
loop is unhealthy), the database answered the last lease renewal, and, on the leader,
the last reconcile pass was not aborted and no runnable supervisor is failing (for
example because its broker is unreachable). A standby that can reach the database is
healthy: standing by is its job. The JSON body says which check failed.
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, MetricsHandler, generate_latest

from reconciler.observe.httpserver import BoundedHTTPServer, RequestHandler
from reconciler.observe.snapshot import SharedRender
from reconciler.spec import secrets

MAX_LOOP_AGE = 120.0  # seconds without a loop iteration before /healthz says 503


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
        # A batch's fixed cost (capture, plan, publish) against its Spark job: what limits a
        # short taskDuration.
        self.phase_seconds = Histogram("reconciler_batch_phase_seconds",
                                       "batch phases: capture (positions), plan, job (Spark), publish",
                                       ["supervisor", "phase"], registry=r,
                                       buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2, 5, 30))
        self.tick_seconds = Histogram("reconciler_tick_duration_seconds", "reconcile pass duration", registry=r,
                                      buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30))
        self.passes = Counter("reconciler_reconcile_passes",
                              "reconcile passes by outcome: changed (applied actions), unchanged, "
                              "deferred (the directory changed while read), aborted", ["outcome"], registry=r)
        self.conflicts = Counter("reconciler_publish_conflicts", "publishes that lost their compare-and-swap", ["supervisor"], registry=r)
        self.resets = Counter("reconciler_resets", "reset requests applied by this daemon", ["supervisor", "trigger"], registry=r)
        self.leader = Gauge("reconciler_leader", "1 while this daemon holds the leader lease", registry=r)
        self.lost = Counter("reconciler_records_lost", "records deleted by the broker's retention before they "
                            "were ingested (recorded in the audit log)", ["supervisor"], registry=r)
        # freshness (issue 32): lag in time, lag policies, the webhook
        self.lag_seconds = Gauge("reconciler_lag_seconds", "age of the oldest record not yet ingested "
                                 "(0: caught up)", ["supervisor", "partition"], registry=r)
        self.breach = Gauge("reconciler_lag_policy_breach", "1 while the lag policy's breach has held for `for`",
                            ["supervisor"], registry=r)
        self.webhook_delivered = Counter("reconciler_webhook_delivered", "events the endpoint accepted",
                                         ["endpoint"], registry=r)
        self.webhook_failures = Counter("reconciler_webhook_failures", "failed delivery attempts (retried)",
                                        ["endpoint"], registry=r)
        self.webhook_dropped = Counter("reconciler_webhook_dropped", "events the endpoint refused for good (4xx)",
                                       ["endpoint"], registry=r)
        self.webhook_failing = Gauge("reconciler_webhook_failing", "1 while the endpoint's last attempt failed",
                                     ["endpoint"], registry=r)
        self.webhook_pending = Gauge("reconciler_webhook_pending", "audit entries not delivered yet",
                                     ["endpoint"], registry=r)
        self._lag_series: dict[str, set[str]] = {}
        self.role = "starting"
        self.failing: dict[str, str] = {}
        self.database_error: str | None = None
        self.reconcile_error: str | None = None
        self.last_loop = 0.0
        self.last_tick = 0.0
        self.max_loop_age = MAX_LOOP_AGE
        self._states: set[str] = set()
        self._lock = threading.Lock()

    # -- written by the runtimes ---------------------------------------------------------

    def observe_positions(self, supervisor: str, checkpoint: Mapping[str, int], target: Mapping[str, int]) -> None:
        for p, end in target.items():
            cp = checkpoint.get(p)
            if cp is not None:
                self.checkpoint.labels(supervisor, p).set(cp)
                self.lag.labels(supervisor, p).set(max(0, end - cp))

    def observe_lag(self, supervisor: str, partitions: Mapping[str, tuple[int | None, int | None, float | None]],
                    *, unknown: bool = False) -> None:
        """The lag observer's round: per partition (checkpoint, target, seconds); unknown seconds
        remove the series (absent is unknown, never 0). ``unknown``: the lag in records cannot be
        told from target minus checkpoint (a source that started over below the checkpoint):
        its series is removed too."""
        seen = self._lag_series.setdefault(supervisor, set())
        for p, (cp, target, seconds) in partitions.items():
            if cp is not None and target is not None:
                self.checkpoint.labels(supervisor, p).set(cp)
            if unknown:
                try:
                    self.lag.remove(supervisor, p)
                except KeyError:
                    pass
            elif cp is not None and target is not None:
                self.lag.labels(supervisor, p).set(max(0, target - cp))
            if seconds is None:
                if p in seen:
                    self.lag_seconds.remove(supervisor, p)
                    seen.discard(p)
            else:
                self.lag_seconds.labels(supervisor, p).set(seconds)
                seen.add(p)

    def forget_lag(self, supervisor: str) -> None:
        """A stream that did not answer: its lag in records and in time are unknown, so their
        series are removed (absent is unknown, never the last value seen, nor 0); the checkpoint
        gauge stays (the database told it)."""
        for gauge in (self.lag, self.lag_seconds):
            for metric in gauge.collect():
                for sample in metric.samples:
                    if sample.labels.get("supervisor") == supervisor:
                        try:
                            gauge.remove(supervisor, sample.labels["partition"])
                        except KeyError:
                            pass
        self._lag_series.pop(supervisor, None)

    def prune_lag(self, observed: Iterable[str]) -> None:
        """Drop the lag-in-time series of supervisors no longer observed (terminated, completed)."""
        keep = set(observed)
        for sid in set(self._lag_series) - keep:
            for p in self._lag_series.pop(sid):
                try:
                    self.lag_seconds.remove(sid, p)
                except KeyError:
                    pass

    def set_breach(self, supervisor: str, fired: bool | None) -> None:
        if fired is None:
            try:
                self.breach.remove(supervisor)
            except KeyError:
                pass
        else:
            self.breach.labels(supervisor).set(1 if fired else 0)

    def batch_done(self, supervisor: str, records: int, unparseable: int, seconds: float,
                   phases: Mapping[str, float] | None = None) -> None:
        self.records.labels(supervisor).inc(records)
        self.unparseable.labels(supervisor).inc(unparseable)
        self.batch_seconds.labels(supervisor).observe(seconds)
        for phase, secs in (phases or {}).items():
            self.phase_seconds.labels(supervisor, phase).observe(secs)

    def records_lost(self, supervisor: str, count: int) -> None:
        self.lost.labels(supervisor).inc(count)

    def publish_conflict(self, supervisor: str) -> None:
        self.conflicts.labels(supervisor).inc()

    def set_failing(self, supervisor: str, error: str | None) -> None:
        with self._lock:
            if error:
                self.failing[supervisor] = secrets.scrub(error)  # served on /healthz
            else:
                self.failing.pop(supervisor, None)

    # -- written by the daemon's loop ----------------------------------------------------

    def loop_alive(self) -> None:
        self.last_loop = time.monotonic()

    def set_role(self, role: str) -> None:
        self.role = role
        self.leader.set(1 if role == "leader" else 0)
        if role != "leader":
            self.clear_failing()

    def reconcile_done(self, outcome: str, seconds: float, error: str | None = None) -> None:
        self.passes.labels(outcome).inc()
        if outcome != "deferred":
            self.tick_seconds.observe(seconds)
            self.last_tick = time.monotonic()
            self.reconcile_error = secrets.scrub(error)

    def set_states(self, states: Mapping[str, str], all_states: Iterable[str]) -> None:
        all_states = list(all_states)
        for sid, st in states.items():
            for s in all_states:
                self.state.labels(sid, s).set(1 if s == st else 0)
        for gone in self._states - set(states):
            for s in all_states:
                try:
                    self.state.remove(gone, s)
                except KeyError:
                    pass
        self._states = set(states)

    def prune_failing(self, runnable: Iterable[str]) -> None:
        """Forget failures of supervisors no longer runnable (terminated, suspended, completed)."""
        keep = set(runnable)
        with self._lock:
            for sid in set(self.failing) - keep:
                del self.failing[sid]

    def clear_failing(self) -> None:
        with self._lock:
            self.failing.clear()

    def lag_by_supervisor(self) -> dict[str, dict[str, float]]:
        """supervisor -> partition -> records behind, as the runtimes last observed them."""
        out: dict[str, dict[str, float]] = {}
        for metric in self.lag.collect():
            for sample in metric.samples:
                out.setdefault(sample.labels["supervisor"], {})[sample.labels["partition"]] = sample.value
        return out

    def passes_count(self, outcome: str) -> int:
        value = self.registry.get_sample_value("reconciler_reconcile_passes_total", {"outcome": outcome})
        return int(value or 0)

    # -- /healthz --------------------------------------------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            failing = dict(self.failing)
        now = time.monotonic()
        loop_age = now - self.last_loop if self.last_loop else None
        problems = []
        if loop_age is None or loop_age >= self.max_loop_age:
            problems.append("the daemon's loop is not running" if loop_age is None
                            else f"the daemon's loop has not run for {loop_age:.0f}s")
        if self.database_error:
            problems.append(f"database: {self.database_error}")
        if self.role == "leader":
            if self.reconcile_error:
                problems.append(f"last reconcile aborted: {self.reconcile_error}")
            problems += [f"{sid}: {err}" for sid, err in sorted(failing.items())]
        ok = not problems
        return ok, {
            "healthy": ok, "role": self.role, "problems": problems, "failing": failing,
            "secondsSinceLoop": loop_age,
            "secondsSinceReconcile": now - self.last_tick if self.last_tick else None,
            "spark": _spark_info(),
        }


def _spark_info() -> dict[str, Any]:
    """Which Spark master and application this daemon uses (imported late: it is only a report)."""
    from reconciler.pipeline.spark import session_info

    return session_info()


def not_found(path: str, pages: bool = True) -> str:
    """The short page of a 404: what was asked and the paths there are."""
    # /supervisors/ID is a pattern, not a page: a link on it would lead elsewhere than it says
    valid = (['<a href="/">/</a>: the status page', "<code>/supervisors/ID</code>: one supervisor's page, "
              'ID as listed on <a href="/">the status page</a>'] if pages else []) + [
        '<a href="/metrics">/metrics</a>: Prometheus metrics', '<a href="/healthz">/healthz</a>: health, as JSON']
    items = "".join(f"<li>{item}</li>" for item in valid)
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>not found</title></head><body>"
            f"<p>No page at <code>{html.escape(path)}</code>. The paths here are:</p><ul>{items}</ul></body></html>")


def serve(metrics: Metrics, address: str, page: Callable[[str], str | None] | None = None) -> BoundedHTTPServer:
    """Start ``/metrics``, ``/healthz`` and (with ``page``) the status page ``/`` and the pages of
    each supervisor ``/supervisors/<id>`` on ``host:port`` in a daemon thread (port 0: any free
    port); HEAD answers as GET without a body. ``page(path)`` returns the HTML, or None for a
    page that does not exist (404). The server is bounded in threads and connections
    (``httpserver``)."""
    host, _, port = address.rpartition(":")
    registry = metrics.registry
    # one exposition for every scraper asking meanwhile, and at most four a second: with 100
    # supervisors it is ~1 MB and tens of ms; a scraper's values are at most 0.25 s old
    exposition = SharedRender(lambda _path: generate_latest(registry), max_age=0.25)

    class Handler(RequestHandler, MetricsHandler):
        def _send(self, code: int, content_type: str, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = self.path.split("?")[0]
            if page is not None and (path in ("/", "/index.html") or path.startswith("/supervisors/")):
                try:
                    body = page(path)
                    if body is None:
                        self._send(404, "text/html; charset=utf-8", not_found(path).encode())
                    else:
                        self._send(200, "text/html; charset=utf-8", body.encode())
                except Exception as exc:  # noqa: BLE001 (the page must say why, not drop the connection)
                    text = html.escape(secrets.scrub(f"{type(exc).__name__}: {exc}"))
                    self._send(500, "text/html; charset=utf-8",
                               f"<!doctype html><p>status page unavailable: {text}</p>".encode())
                return
            if path == "/healthz":
                ok, body = metrics.health()
                data = json.dumps(body, default=str).encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, exposition.get("/metrics"))
                return
            # any other path answered /metrics with 200: a typo looked like a working page
            self._send(404, "text/html; charset=utf-8", not_found(path, page is not None).encode())

        def log_message(self, *args):  # access logs would drown the event log
            pass

    Handler.registry = registry
    return BoundedHTTPServer((host.strip("[]") or "127.0.0.1", int(port)), Handler).start()
