"""Turn stream-reconciler's webhook events into Slack messages (an example; standard library only).

The daemon POSTs every audit event as JSON to each URL of its ``webhook`` setting
(``--webhook``, ``RECONCILER_WEBHOOK``). Slack's incoming webhooks want their own shape, so
this small relay sits between them: the daemon posts to it, it posts a message to Slack.

    SLACK_WEBHOOK_URL=https://hooks.slack.com/services/T000/B000/XXXX \\
        python3 examples/webhook/slack_relay.py --listen 127.0.0.1:8099
    RECONCILER_WEBHOOK=http://127.0.0.1:8099/ reconciler run

Without ``SLACK_WEBHOOK_URL`` it prints each message instead (to see the shape). It answers
the daemon 502 when Slack does not take a message, so the daemon retries it (delivery is at
least once; ``id`` is the audit entry's id, the same on a retry). ``--only`` keeps some types,
e.g. ``--only reset.applied,backfill.completed,lag.breach,health.unhealthy``.

Every value taken from an event (a reason is whatever an operator or a marker file wrote) has
``&``, ``<`` and ``>`` escaped as Slack asks, so ``<!channel>``, ``<@U123>`` or a ``<url|link>``
in it reaches the channel as text, not as a mention or a link.

An event (see ``reconciler/observe/events.py``)::

    {"type": "reset.applied", "supervisor": "clicks", "time": "2026-11-20T10:00:00+00:00", "id": 42,
     "action": "reset-and-backfill", "actor": "policy", "reason": "lag policy: 1.4h > 1h",
     "details": {"backfill": "clicks-backfill-1", "backfillRecords": 98000, ...}, "summary": "..."}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ICONS = {
    "reset.applied": ":rewind:", "reset.rejected": ":no_entry:", "backfill.created": ":arrows_counterclockwise:",
    "backfill.progress": ":hourglass_flowing_sand:", "backfill.completed": ":white_check_mark:",
    "backfill.cancelled": ":x:", "lag.breach": ":warning:", "lag.recovered": ":large_green_circle:",
    "health.unhealthy": ":red_circle:", "health.recovered": ":large_green_circle:", "retention.loss": ":x:",
    "supervisor.invalid": ":pencil2:",
}


def escape(value: Any) -> str:
    """``value`` as Slack text that stays text: Slack reads ``<...>`` as a mention, a channel
    ping or a link, and ``&`` starts an entity (https://api.slack.com/reference/surfaces/formatting#escaping)."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_message(event: dict[str, Any]) -> dict[str, Any]:
    """The Slack message (``text`` for notifications, ``blocks`` for the channel) of one event."""
    kind, sid = escape(event["type"]), escape(event["supervisor"])
    d = {k: escape(v) if isinstance(v, str) else v for k, v in (event.get("details") or {}).items()}
    icon = ICONS.get(event["type"], ":information_source:")
    headline = {
        "reset.applied": f"*{sid}* reset to latest by *{escape(event.get('actor'))}*",
        "backfill.completed": f"backfill *{sid}* completed",
        "backfill.progress": f"backfill *{sid}* at {d.get('percent')}% ({d.get('done', 0):,} of {d.get('total', 0):,})",
        "lag.breach": f"*{sid}* breaches its lag policy",
        "lag.recovered": f"*{sid}* is back within its lag policy",
        "health.unhealthy": f"*{sid}* is {d.get('state', 'UNHEALTHY')}",
        "health.recovered": f"*{sid}* recovered ({d.get('state')})",
        "retention.loss": f"*{sid}* LOST {d.get('lostRecords', 0):,} records to the broker's retention",
    }.get(event["type"], f"*{sid}*: {kind}")
    lines = [f"{icon} {headline}"]
    if event["type"] == "reset.applied" and d.get("backfill"):
        lines.append(f"backfill `{d['backfill']}` ingests the {d.get('backfillRecords', 0):,} records skipped")
    if event.get("reason"):
        lines.append("> " + escape(event["reason"]).replace("\n", "\n> "))
    return {
        "text": f"{icon} {headline}".replace("*", ""),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text":
                                              f"{kind} · {escape(event.get('time'))} · audit entry "
                                              f"{escape(event.get('id'))}"}]},
        ],
    }


def make_server(listen: str, slack_url: str | None, only: set[str] | None = None, out=sys.stdout) -> ThreadingHTTPServer:
    host, _, port = listen.rpartition(":")

    class Relay(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            event = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if only is None or event.get("type") in only:
                message = slack_message(event)
                if slack_url is None:
                    print(json.dumps(message), file=out, flush=True)
                else:
                    try:
                        req = urllib.request.Request(slack_url, data=json.dumps(message).encode(), method="POST",
                                                     headers={"Content-Type": "application/json"})
                        urllib.request.urlopen(req, timeout=10).close()
                    except (urllib.error.URLError, OSError):
                        self.send_response(502)  # the daemon retries this event
                        self.end_headers()
                        return
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    return ThreadingHTTPServer((host or "127.0.0.1", int(port)), Relay)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", default="127.0.0.1:8099")
    ap.add_argument("--only", help="comma-separated event types to forward (default: all)")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    server = make_server(args.listen, os.environ.get("SLACK_WEBHOOK_URL"), only)
    print(f"relaying stream-reconciler events on http://{args.listen}/", file=sys.stderr)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
