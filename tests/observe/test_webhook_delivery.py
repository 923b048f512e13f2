"""Webhook delivery against a real local HTTP server and a real SQLite store (issue 32): in the
audit log's order; retried with backoff while the endpoint fails; an event refused for good is
dropped, not retried forever; the cursor survives a restart; a hole in the audit ids is waited
for; what is written before shutdown is still delivered; the URL's secret is never shown.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from reconciler.observe import webhook, webhook_post
from reconciler.observe.events import TYPES, event, event_type
from reconciler.observe.metrics import Metrics
from reconciler.observe.webhook import Endpoint, WebhookDelivery, endpoint_label
from reconciler.spec import secrets
from reconciler.store.store import Store
from tests.e2e.receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def audit(store: Store, n: int, action: str = "create", start: int = 0) -> None:
    for i in range(start, start + n):
        store.audit(f"s{i}", action, "test", reason=f"event {i}", details={"n": i})


def test_events_in_order_with_retries_and_a_drop(store, receiver, caplog):
    metrics = Metrics()
    delivery = WebhookDelivery(store, [receiver.url], metrics)
    delivery.start()  # a new endpoint starts at the newest entry: the past is not replayed
    try:
        receiver.fail_next = 2  # an outage: retried, nothing skipped or reordered
        audit(store, 5)
        got = receiver.wait_for(lambda ev: len(ev) == 5, 30)
        assert [e["reason"] for e in got] == [f"event {i}" for i in range(5)]
        receiver.fail_status, receiver.fail_next = 400, 1  # refused for good: dropped, the rest goes on
        with caplog.at_level(logging.WARNING):
            audit(store, 2, start=5)
            got = receiver.wait_for(lambda ev: len(ev) == 6, 30)
        assert [e["reason"] for e in got][-1] == "event 6"
        assert "refused event" in caplog.text and "s3cr3t-token" not in caplog.text
    finally:
        delivery.stop()
    label = endpoint_label(receiver.url)
    assert "s3cr3t" not in label and label.startswith("http://127.0.0.1:")
    sample = metrics.registry.get_sample_value
    assert sample("reconciler_webhook_delivered_total", {"endpoint": label}) == 6
    assert sample("reconciler_webhook_failures_total", {"endpoint": label}) == 3
    assert sample("reconciler_webhook_dropped_total", {"endpoint": label}) == 1
    [cursor] = store.webhook_cursors()
    assert cursor.last_id == store.last_audit_id() and cursor.failing_since is None


def test_the_cursor_survives_a_restart_and_shutdown_flushes(store, receiver):
    delivery = WebhookDelivery(store, [receiver.url])
    delivery.start()
    audit(store, 2)
    receiver.wait_for(lambda ev: len(ev) == 2, 30)
    delivery.stop()
    audit(store, 3, start=2)  # written while no daemon delivers (a leader change)
    delivery = WebhookDelivery(store, [receiver.url])
    delivery.start()
    audit(store, 1, start=5)
    delivery.stop(flush=10)  # the last one is written, then the daemon stops at once: still delivered
    assert [e["reason"] for e in receiver.events] == [f"event {i}" for i in range(6)]


def test_an_endpoint_that_does_not_answer_holds_nobody(store, receiver, monkeypatch):
    monkeypatch.setattr(webhook_post, "TIMEOUT", 0.5)
    receiver.hang = True
    other = Receiver()
    delivery = WebhookDelivery(store, [receiver.url, other.url])
    try:
        delivery.start()
        started = time.monotonic()
        audit(store, 3)  # what the daemon does: write the audit log; it never waits on delivery
        assert time.monotonic() - started < 5
        other.wait_for(lambda ev: len(ev) == 3, 30)  # the healthy endpoint is not held by the dead one
        deadline = time.monotonic() + 30
        while not any(c.failing_since for c in store.webhook_cursors()):
            assert time.monotonic() < deadline, "the hanging endpoint is not reported failing"
            time.sleep(0.1)
        failing = [c for c in store.webhook_cursors() if c.failing_since]
        assert len(failing) == 1 and "timed out" in failing[0].last_error and failing[0].pending == 3
    finally:
        delivery.stop(flush=0)
        other.close()


def test_a_hole_in_the_audit_ids_is_waited_for(store, monkeypatch):
    """PostgreSQL hands out ids at insert, not at commit: id 12 may become visible after 13."""
    monkeypatch.setattr(webhook, "GAP_WAIT", 10.0)
    e = Endpoint(store, "http://127.0.0.1:1/x")
    from reconciler.store.freshness import WebhookCursor

    e.cursor = WebhookCursor(e.key, e.label, 10)
    entries = [{"id": 11}, {"id": 13}, {"id": 14}]
    assert [x["id"] for x in e._contiguous(entries, now=100.0)] == [11]
    e.cursor = WebhookCursor(e.key, e.label, 11)
    assert e._contiguous(entries[1:], now=105.0) == []  # 12 may still commit
    assert [x["id"] for x in e._contiguous(entries[1:], now=111.0)] == [13, 14]  # rolled back: passed over


def test_event_documents(store):
    secrets.scrubber.learn("hunter2-secret-value")  # as a resolved reference is learnt
    store.audit("clicks", "reset-and-backfill", "policy", trigger="policy: lag policy breach since X",
                reason="lag policy: 1.4h > 1h; token hunter2-secret-value",
                details={"backfill": "clicks-backfill-1", "backfillRecords": 98_000,
                         "source": {"consumerProperties": {"sasl.password": "plain"}}})
    [entry] = store.audit_after(0)
    doc = event(entry)
    assert doc["type"] == "reset.applied" and doc["supervisor"] == "clicks" and doc["actor"] == "policy"
    assert doc["time"].endswith("+00:00") and doc["id"] == entry["id"]
    assert "hunter2-secret-value" not in str(doc) and "plain" not in str(doc)
    assert doc["summary"].startswith("clicks: reset.applied by policy (backfill clicks-backfill-1 of 98,000 records")
    assert event_type("completed") == "backfill.completed" and event_type("something-new") == "audit.something-new"
    assert len(set(TYPES.values())) < len(TYPES)  # several actions share a type, none is renamed
