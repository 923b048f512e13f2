"""Webhook delivery against receivers that misbehave (issue 41), each a real server on loopback
answering raw bytes: whatever an attempt raises, the endpoint's thread lives on, retries with
backoff and shows the failure (the cursor that ``status`` and the page read, ``/metrics``); a
redirect is never followed; one POST has a whole deadline; the receiver's reason phrase reaches
the operator's terminal escaped; a URL with credentials is refused without showing them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from reconciler import settings as settings_mod
from reconciler.errors import PermanentError
from reconciler.observe import render, webhook_post
from reconciler.observe.metrics import Metrics
from reconciler.observe.webhook import WebhookDelivery, endpoint_label
from reconciler.store.freshness import WebhookCursor
from reconciler.store.store import Store
from tests.observe.rawhttp import NO_CONTENT, RawServer, send, trickle


@pytest.fixture
def server() -> Iterator[RawServer]:
    srv = RawServer()
    try:
        yield srv
    finally:
        srv.close()


def audit(store: Store, n: int = 1) -> None:
    for i in range(n):
        store.audit(f"s{i}", "create", "test", reason=f"event {i}")


def failing(store: Store, timeout: float = 10.0) -> WebhookCursor:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hit = [c for c in store.webhook_cursors() if c.failing_since]
        if hit:
            return hit[0]
        time.sleep(0.05)
    raise AssertionError(f"no endpoint reported failing within {timeout}s: {store.webhook_cursors()}")


def delivered(store: Store, timeout: float = 10.0) -> WebhookCursor:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        [c] = store.webhook_cursors()
        if c.last_id == store.last_audit_id() and not c.failing_since:
            return c
        time.sleep(0.05)
    raise AssertionError(f"not delivered within {timeout}s: {store.webhook_cursors()}")


def started(store: Store, url: str, metrics: Metrics | None = None, **kw) -> WebhookDelivery:
    d = WebhookDelivery(store, [url], metrics, **kw)
    d.start()
    return d


GARBLED = {
    "a bad status line": (b"HELLO receiver here\r\n\r\n", "BadStatusLine"),
    "101 header lines": (b"HTTP/1.1 204 No Content\r\n" + b"X-Filler: 1\r\n" * 101 + b"\r\n", "more than 100 headers"),
    "a header line too long": (b"HTTP/1.1 204 No Content\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", "LineTooLong"),
}


@pytest.mark.parametrize("payload,shown", GARBLED.values(), ids=GARBLED.keys())
def test_a_garbled_answer_is_a_failure_shown_and_retried(store, server, payload, shown):
    server.answer = send(payload)
    metrics = Metrics()
    delivery = started(store, server.url(), metrics)
    [endpoint] = delivery.endpoints
    try:
        audit(store)
        cursor = failing(store)
        assert shown in cursor.last_error and "s3cr3t" not in cursor.last_error
        assert endpoint._thread.is_alive(), "the endpoint's thread died"
        label = endpoint_label(server.url())
        assert metrics.registry.get_sample_value("reconciler_webhook_failing", {"endpoint": label}) == 1
        assert metrics.registry.get_sample_value("reconciler_webhook_failures_total", {"endpoint": label}) >= 1
        assert "FAILING since" in render.webhooks_text([c.to_dict() for c in store.webhook_cursors()])
        server.answer = NO_CONTENT  # the receiver is mended: the same event goes through on a retry
        delivered(store)
        assert metrics.registry.get_sample_value("reconciler_webhook_failing", {"endpoint": label}) == 0
    finally:
        delivery.stop(flush=0)


def test_an_unexpected_exception_of_an_attempt_does_not_end_the_thread(store, server):
    calls = []

    def send_once_broken(url, doc):
        calls.append(doc["id"])
        if len(calls) == 1:
            raise RuntimeError("a bug in a sender \x1b[2J")
        webhook_post.post(url, doc)

    delivery = started(store, server.url(), send=send_once_broken)
    try:
        audit(store)
        cursor = failing(store)
        # its type and where, never its text (which may quote the URL's path)
        assert cursor.last_error == f"RuntimeError (http://127.0.0.1:{urlsplit(server.url()).port})"
        delivered(store)
        assert len(server.requests) == 1 and calls == [calls[0]] * 2
    finally:
        delivery.stop(flush=0)


def test_terminal_escapes_in_the_reason_phrase_reach_status_escaped(store, server):
    server.answer = send(b"HTTP/1.1 503 \x1b[2J\x1b]0;owned\x07down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    delivery = started(store, server.url())
    try:
        audit(store)
        cursor = failing(store)
    finally:
        delivery.stop(flush=0)
    text = render.webhooks_text([c.to_dict() for c in store.webhook_cursors()])
    assert "\x1b" not in text and "\x07" not in text and "\x1b" not in cursor.last_error
    assert "HTTP 503 \\x1b[2J\\x1b]0;owned\\x07down" in text, text


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_not_followed_and_is_reported(store, server, code):
    elsewhere = RawServer()  # accepts anything: a followed redirect would count the event delivered
    location = f"http://127.0.0.1:{elsewhere.port}/stolen?token=abc"
    server.answer = send(f"HTTP/1.1 {code} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())
    metrics = Metrics()
    delivery = started(store, server.url(), metrics)
    try:
        audit(store)
        cursor = failing(store)
        deadline = time.monotonic() + 1.0  # a second attempt too (backoff 0.5 s): still not followed
        while len(server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        delivery.stop(flush=0)
        elsewhere.close()
    assert elsewhere.requests == [], "the redirect was followed"
    assert f"HTTP {code} Moved: a redirect to http://127.0.0.1:{elsewhere.port}, not followed" in cursor.last_error
    assert "stolen" not in cursor.last_error and "token" not in cursor.last_error
    assert cursor.last_id < store.last_audit_id()  # not counted as delivered
    label = endpoint_label(server.url())
    assert not metrics.registry.get_sample_value("reconciler_webhook_delivered_total", {"endpoint": label})
    assert not metrics.registry.get_sample_value("reconciler_webhook_dropped_total", {"endpoint": label})


def test_a_trickling_receiver_is_cut_at_the_whole_deadline(store, server, monkeypatch):
    """Each byte comes well within a read's timeout; the POST as a whole still ends on time."""
    monkeypatch.setattr(webhook_post, "TIMEOUT", 1.0)
    server.answer = trickle(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n", every=0.3)
    delivery = started(store, server.url())
    [endpoint] = delivery.endpoints
    try:
        audit(store)
        began = time.monotonic()
        cursor = failing(store, timeout=4.0)
        assert time.monotonic() - began < 3.0
        assert "timed out: no complete answer within 1 s" in cursor.last_error
        assert endpoint._thread.is_alive()
    finally:
        delivery.stop(flush=0)
    deadline = time.monotonic() + 3.0  # the trickler learns of the cut at its next bytes
    while not server.cut_after and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.cut_after and server.cut_after[0] < 2.5, server.cut_after  # the socket was shut, not left
    assert store.webhook_cursors()[0].last_id < store.last_audit_id()


URLS_WITH_CREDENTIALS = {
    "user and password, no port": "https://relay:hunter2@hooks.example.com/services/T0",
    "user and password, a port": "http://relay:hunter2@127.0.0.1:8099/",
    "a password alone": "https://:hunter2@hooks.example.com/x",
    "the second of two": "https://ok.example.com/a,https://relay:hunter2@hooks.example.com/x",
}


@pytest.mark.parametrize("url", URLS_WITH_CREDENTIALS.values(), ids=URLS_WITH_CREDENTIALS.keys())
def test_credentials_in_a_webhook_url_are_refused_without_showing_them(url):
    with pytest.raises(PermanentError) as err:
        settings_mod.load({"webhook": url}, config=os.devnull, env={})
    message = str(err.value)
    assert message.startswith("webhook: ") and "credentials (user:password@)" in message
    assert "RECONCILER_WEBHOOK" in message and "hunter2" not in message and "relay" not in message


def test_credentials_that_reach_delivery_are_never_sent_nor_shown(store, caplog):
    """Settings refuse them; a URL handed to delivery some other way fails the same, unsent."""
    with caplog.at_level(logging.DEBUG):
        delivery = started(store, "http://relay:hunter2@localhost/hook")
        [endpoint] = delivery.endpoints
        try:
            audit(store)
            cursor = failing(store)
            assert endpoint._thread.is_alive()
        finally:
            delivery.stop(flush=0)
    assert "credentials" in cursor.last_error and "hunter2" not in cursor.last_error
    assert "hunter2" not in caplog.text


def test_a_proxy_in_the_environment_is_still_used(store, server, monkeypatch):
    """urllib went through ``http_proxy`` / ``https_proxy``; the bounded POST does too (a daemon
    behind a proxy keeps delivering), with the proxy's credentials as Proxy-Authorization."""
    monkeypatch.setenv("http_proxy", f"http://squid:pa55@127.0.0.1:{server.port}")
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{server.port}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    webhook_post.post("http://receiver.invalid/hooks/x?t=1", {"type": "t", "id": 1})
    head = server.requests[-1].decode()
    assert head.startswith("POST http://receiver.invalid/hooks/x?t=1 HTTP/1.1\r\n")
    assert "Proxy-Authorization: Basic c3F1aWQ6cGE1NQ==" in head and "Host: receiver.invalid" in head
    server.answer = send(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(webhook_post.DeliveryFailed, match="Tunnel connection failed: 403"):
        webhook_post.post("https://receiver.invalid/hooks/x", {"type": "t", "id": 2})
    assert server.requests[-1].decode().startswith("CONNECT receiver.invalid:443 HTTP/1.")
