"""The Slack example (``examples/webhook/slack_relay.py``) between the daemon's real webhook
delivery and a local stand-in for Slack's incoming webhook (a real HTTP server): the events of
a policy reset and a backfill's completion become Slack messages; a message Slack does not take
is retried through the daemon's own retry; what an event says reaches the channel as text,
never as a mention or a link (issue 41).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

from reconciler.observe.webhook import WebhookDelivery
from reconciler.store.store import Store
from tests.e2e.receiver import Receiver

RELAY = Path(__file__).resolve().parents[2] / "examples" / "webhook" / "slack_relay.py"


def _relay_module():
    spec = importlib.util.spec_from_file_location("slack_relay", RELAY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_policy_reset_and_completion_reach_slack(tmp_path):
    relay = _relay_module()
    slack = Receiver()
    slack.fail_next = 1  # Slack refuses once: the relay answers 502, the daemon retries
    server = relay.make_server("127.0.0.1:0", slack.url, only={"reset.applied", "backfill.completed"})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    delivery = WebhookDelivery(store, [f"http://127.0.0.1:{server.server_address[1]}/"])
    try:
        delivery.start()
        store.audit("clicks", "reset-and-backfill", "policy", trigger="policy: lag policy breach since 10:00:00Z",
                    reason="lag policy: 1.4h > 1h", details={"backfill": "clicks-backfill-1", "backfillRecords": 98_000})
        store.audit("clicks", "update", "daemon")  # filtered out by --only
        store.audit("clicks-backfill-1", "completed", "reconciler", reason="every partition reached its end offset")
        messages = slack.wait_for(lambda ev: len(ev) == 2, 30)
    finally:
        delivery.stop()
        server.shutdown()
        slack.close()
        store.close()
    first, second = messages
    assert first["text"] == ":rewind: clicks reset to latest by policy"
    body = first["blocks"][0]["text"]["text"]
    assert "backfill `clicks-backfill-1` ingests the 98,000 records skipped" in body and "> lag policy: 1.4h &gt; 1h" in body
    assert first["blocks"][1]["elements"][0]["text"].startswith("reset.applied · ")
    assert second["text"] == ":white_check_mark: backfill clicks-backfill-1 completed"
    assert slack.requests == 3  # the refused one was sent again


def test_an_events_words_never_ping_nor_link(tmp_path):
    """A reason is whatever an operator or a marker file wrote: ``<!channel>`` in it must not
    page a whole channel, nor ``<https://...|text>`` become a disguised link."""
    relay = _relay_module()
    slack = Receiver()
    server = relay.make_server("127.0.0.1:0", slack.url)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    delivery = WebhookDelivery(store, [f"http://127.0.0.1:{server.server_address[1]}/"])
    try:
        delivery.start()
        store.audit("clicks<!here>", "reset-and-backfill", "policy & <@U0ADMIN>",
                    reason="<!channel> R&D says <https://evil.example/login|the runbook>\n<@U123> look",
                    details={"backfill": "b<!everyone>", "backfillRecords": 1})
        [message] = slack.wait_for(lambda ev: len(ev) == 1, 30)
    finally:
        delivery.stop()
        server.shutdown()
        slack.close()
        store.close()
    body = message["blocks"][0]["text"]["text"]
    shown = [message["text"], body, message["blocks"][1]["elements"][0]["text"]]
    for text in shown:
        assert "<" not in text and ">" not in text.replace("\n> ", "\n").removeprefix("> "), text
    assert "> &lt;!channel&gt; R&amp;D says &lt;https://evil.example/login|the runbook&gt;\n> &lt;@U123&gt; look" in body
    assert message["text"] == ":rewind: clicks&lt;!here&gt; reset to latest by policy &amp; &lt;@U0ADMIN&gt;"
    assert "backfill `b&lt;!everyone&gt;`" in body
