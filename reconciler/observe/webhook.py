"""Webhook delivery: every audit entry, as an event (``observe.events``), POSTed as JSON to each
URL of the ``webhook`` setting, in order, by the leader.

Why follow the audit log rather than hand events from where they happen: the audit log is
already written in the same transaction as what it records (a reset, a state change), it is
durable and ordered, and every process writes it (the daemon, ``reconciler reset``, ``suspend``).
So an event is never announced for something that rolled back, nor lost because the process
that made it had no webhook: one follower per endpoint reads the entries after its cursor.

* **Never blocks the tick.** Nothing in a reconcile pass or a runtime waits on delivery: they
  write the audit log as always, and a thread per endpoint reads it.
* **Bounded queue.** An endpoint's thread holds at most ``QUEUE`` entries read ahead; an
  endpoint that is down makes its thread wait, not its memory grow: the rest stays in the
  database until delivered.
* **Retried with backoff** (0.5 s doubling to ``MAX_BACKOFF``) while the endpoint fails (no
  complete answer within ``webhook_post.TIMEOUT``, a refused connection, a garbled answer, a
  redirect, HTTP 5xx, 408, 429: whatever an attempt raises, the thread goes on and the failure
  shows). An event refused for good (any other 4xx) is dropped after logging: retrying it
  would hold every later one. How one POST is bounded: ``webhook_post``.
* **The cursor is in the database** (``webhook_cursors``: the last entry delivered, and since
  when the endpoint fails, for ``reconciler status``): a new leader goes on where the last one
  stopped, so delivery is at least once (a receiver deduplicates by ``id``). A new endpoint
  starts at the newest entry, without the past; one that comes back more than ``BACKLOG``
  entries behind is sent the last ``BACKLOG`` (the skipped ones are logged and counted).
* **In order, without skipping.** Entries are delivered by ascending id. PostgreSQL hands out
  ids when a transaction inserts, not when it commits, so an id can become visible after a
  higher one: a hole in the ids is waited for (``GAP_WAIT``) before it is passed over (a rolled
  back transaction leaves one for good).
* **At shutdown**, what is already in the audit log is still delivered for up to ``FLUSH``
  seconds (a ``run --until-caught-up`` announces the backfill it waited for).

The URL is never logged nor stored (Slack's, for one, hold a secret token): only its scheme,
host and port, and a hash to tell two endpoints on one host apart.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from reconciler.errors import ReconcilerError, printable
from reconciler.observe import webhook_post
from reconciler.observe.events import event
from reconciler.observe.webhook_post import DeliveryFailed, describe, post, short
from reconciler.store.freshness import WebhookCursor
from reconciler.store.store import Store

log = logging.getLogger(__name__)

QUEUE = 100  # audit entries read ahead per endpoint
MAX_BACKOFF = 60.0
POLL = 0.25  # seconds between looks at the audit log while idle
GAP_WAIT = 10.0  # seconds a hole in the audit ids is waited for
FLUSH = 5.0  # seconds at shutdown to deliver what is already written
BACKLOG = 10_000  # audit entries an endpoint that comes back is sent at most (the rest: dropped, logged)


def endpoint_key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


def endpoint_label(url: str) -> str:
    """``https://hooks.slack.com/services/T0/B0/XYZ`` -> ``https://hooks.slack.com#1a2b3c``
    (a control character of the host escaped: the label is printed in terminals)."""
    parts = urlsplit(url)
    host = printable(parts.hostname or "?")
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}#{endpoint_key(url)[:6]}"


__all__ = ["DeliveryFailed", "Endpoint", "WebhookDelivery", "endpoint_key", "endpoint_label", "post"]


class Endpoint:
    """One URL's follower: a thread reading the audit log after its cursor and POSTing in order."""

    def __init__(self, store: Store, url: str, metrics: Any = None, *,
                 send: Callable[[str, dict[str, Any]], None] = post):
        self.store = store
        self.url = url
        self.key = endpoint_key(url)
        self.label = endpoint_label(url)
        self.metrics = metrics
        self.send = send
        self.cursor: WebhookCursor | None = None
        self._stop = threading.Event()
        self._deadline: float | None = None  # set by stop(): deliver until then, then leave
        self._target = 0  # at stop: the last entry to deliver before leaving
        self._thread: threading.Thread | None = None
        self._gap: tuple[int, float] | None = None  # (first missing id, when first seen)
        self.attempts = 0
        self._pending_at = 0.0

    def begin(self) -> None:
        """Load or create the cursor (before the first pass writes anything: no event missed)."""
        now = datetime.now(UTC)
        cursor = self.store.webhook_cursor(self.key)
        top = self.store.last_audit_id()
        if cursor is None:
            cursor = WebhookCursor(self.key, self.label, top)
            self.store.save_webhook_cursor(cursor, now=now)
            log.info("webhook %s: new endpoint; events from audit entry %d on", self.label, cursor.last_id)
        elif top - cursor.last_id > BACKLOG:  # an endpoint back after months: not months of events
            skipped = top - BACKLOG - cursor.last_id
            log.warning("webhook %s: %d audit entries behind; the oldest %d are not sent (see `reconciler "
                        "history`)", self.label, top - cursor.last_id, skipped)
            if self.metrics is not None:
                self.metrics.webhook_dropped.labels(self.label).inc(skipped)
            cursor = WebhookCursor(cursor.endpoint, cursor.label, top - BACKLOG, cursor.failing_since,
                                   cursor.last_error, cursor.delivered_at)
            self.store.save_webhook_cursor(cursor, now=now)
        self.cursor = cursor
        if self.metrics is not None:
            self.metrics.webhook_failing.labels(self.label).set(1 if cursor.failing_since else 0)
        self._thread = threading.Thread(target=self._run, name=f"webhook-{self.key[:6]}", daemon=True)
        self._thread.start()

    def request_stop(self, flush: float = FLUSH) -> None:
        """Deliver what is in the audit log now for up to ``flush`` seconds, then stop."""
        try:
            self._target = self.store.last_audit_id()
        except ReconcilerError:
            self._target = 0
        self._deadline = time.monotonic() + max(0.0, flush)
        self._stop.set()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, (self._deadline or 0) - time.monotonic()) + webhook_post.TIMEOUT + 1)
            self._thread = None

    # -- the thread ----------------------------------------------------------------------------

    def _leaving(self) -> bool:
        if not self._stop.is_set():
            return False
        return (self.cursor.last_id >= self._target or self._deadline is None
                or time.monotonic() >= self._deadline)

    def _wait(self, seconds: float) -> None:
        if self._stop.is_set():  # draining: no long naps, but no busy loop either
            time.sleep(min(seconds, 0.05, max(0.0, (self._deadline or 0) - time.monotonic())))
        else:
            self._stop.wait(seconds)

    def _run(self) -> None:
        while not self._leaving():
            try:
                self._step()
            except ReconcilerError as exc:
                log.debug("webhook %s: cannot read the audit log now: %s", self.label, exc)
                self._wait(1.0)
            except Exception as exc:  # noqa: BLE001 - a thread that dies stops delivery for good, unseen
                self._failed(describe(exc, self.url))
                self._wait(1.0)

    def _step(self) -> None:
        entries = self._next()
        if not entries:
            self._pending()
            self._wait(POLL)
            return
        for entry in entries:
            if not self._deliver(entry):
                break
        self._pending()

    def _next(self) -> list:
        entries = self.store.audit_after(self.cursor.last_id, QUEUE)
        return self._contiguous(entries, time.monotonic())

    def _contiguous(self, entries: Sequence, now: float) -> list:
        """The entries up to the first hole in the ids, unless the hole is older than GAP_WAIT."""
        expected = self.cursor.last_id + 1
        out = []
        for e in entries:
            if e["id"] != expected:
                first, seen = self._gap if self._gap and self._gap[0] == expected else (expected, now)
                self._gap = (first, seen)
                if now - seen < GAP_WAIT:
                    break
                log.debug("webhook %s: audit ids %d..%d never appeared; going on", self.label, expected, e["id"] - 1)
                self._gap = None
            out.append(e)
            expected = e["id"] + 1
        return out

    def _deliver(self, entry) -> bool:
        """POST one entry until it is accepted or refused for good; False when told to leave."""
        doc = event(entry)
        backoff = 0.5
        while True:
            if self._stop.is_set() and self._deadline is not None and time.monotonic() >= self._deadline:
                return False
            try:
                self.attempts += 1
                self.send(self.url, doc)
            except Exception as exc:  # noqa: BLE001 - any failed attempt is retried and shown (webhook_post)
                if not isinstance(exc, DeliveryFailed):
                    exc = DeliveryFailed(describe(exc, self.url))
                self._failed(str(exc))
                if exc.permanent:
                    log.warning("webhook %s refused event %d (%s) for good: %s; dropped", self.label, doc["id"],
                                doc["type"], exc)
                    if self.metrics is not None:
                        self.metrics.webhook_dropped.labels(self.label).inc()
                    self._advance(doc["id"], delivered=False)
                    return True
                self._wait(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
                continue
            self._advance(doc["id"], delivered=True)
            return True

    def _failed(self, error: str) -> None:
        error = short(error)  # the receiver's words, shown in a terminal: no escapes, not a page of them
        if self.metrics is not None:
            self.metrics.webhook_failures.labels(self.label).inc()
            self.metrics.webhook_failing.labels(self.label).set(1)
        c = self.cursor
        if c.failing_since is None or c.last_error != error:
            if c.failing_since is None:
                log.warning("webhook %s failing: %s (retrying with backoff; events wait in the audit log)",
                            self.label, error)
            self._save(WebhookCursor(c.endpoint, c.label, c.last_id, c.failing_since or datetime.now(UTC), error,
                                     c.delivered_at))

    def _advance(self, audit_id: int, *, delivered: bool) -> None:
        c = self.cursor
        now = datetime.now(UTC)
        if delivered and c.failing_since is not None:
            log.info("webhook %s delivers again", self.label)
        if delivered and self.metrics is not None:
            self.metrics.webhook_delivered.labels(self.label).inc()
            self.metrics.webhook_failing.labels(self.label).set(0)
        failing = None if delivered else c.failing_since
        self._save(WebhookCursor(c.endpoint, c.label, audit_id, failing, None if delivered else c.last_error,
                                 now if delivered else c.delivered_at))

    def _save(self, cursor: WebhookCursor) -> None:
        self.cursor = cursor
        try:
            self.store.save_webhook_cursor(cursor, now=datetime.now(UTC))
        except ReconcilerError as exc:  # kept in memory; written with the next change
            log.debug("webhook %s: cursor not saved now: %s", self.label, exc)

    def _pending(self) -> None:
        if self.metrics is None or time.monotonic() - self._pending_at < 2.0:
            return
        self._pending_at = time.monotonic()
        try:
            self.metrics.webhook_pending.labels(self.label).set(max(0, self.store.last_audit_id() - self.cursor.last_id))
        except ReconcilerError:
            pass


class WebhookDelivery:
    """Every endpoint of the ``webhook`` setting."""

    def __init__(self, store: Store, urls: Sequence[str], metrics: Any = None, *,
                 send: Callable[[str, dict[str, Any]], None] = post):
        self.endpoints = [Endpoint(store, u, metrics, send=send) for u in dict.fromkeys(urls)]

    def start(self) -> None:
        for e in self.endpoints:
            e.begin()

    def stop(self, flush: float = FLUSH, *, wait: bool = True) -> None:
        """``wait=False`` (a deposed leader): the threads leave after the POST they are in; the
        loop does not wait for an endpoint that does not answer."""
        for e in self.endpoints:  # all drain at once: a slow endpoint does not hold the others' time
            e.request_stop(flush)
        for e in self.endpoints if wait else ():
            e.join()
