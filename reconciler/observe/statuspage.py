"""The daemon's status page (``GET /`` on the ``http`` address): one server-rendered HTML page.

What an operator opens during an incident: the daemon's health, every supervisor with its
state, per-partition lag, backfill progress and ETA, its last error, and the recent resets
from the audit log. It refreshes itself every ``REFRESH`` seconds. No scripts, no front-end
build, nothing fetched from elsewhere; every value is HTML-escaped, sources are not shown
(errors were scrubbed of secrets before they were stored), and the page is served on the
same loopback address as ``/metrics``.

``render`` is pure: the HTTP handler gathers the data (``status.all_status`` without broker
calls, the runtimes' last observed lag, the audit log) and hands it in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

REFRESH = 5  # seconds
RESET_ACTIONS = ("reset", "reset-and-backfill", "retention-loss", "reject-request", "fresh-start",
                 "cancel-backfill", "suspend-backfill", "resume-backfill", "operator-suspend", "operator-resume")

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:20px;margin:0 0 .3em} h2{font-size:16px;margin:1.4em 0 .4em}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:.3em .6em;border-bottom:1px solid #ddd;
vertical-align:top} th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#176c2f} .bad{color:#b3261e;font-weight:600} .muted{color:#777} .err{color:#b3261e;max-width:40em}
progress{width:9em} code{font-size:13px}
"""


def render(items: Sequence[Mapping[str, Any]], resets: Sequence[Mapping[str, Any]], health: tuple[bool, Mapping],
           lag: Mapping[str, Mapping[str, float]], now: datetime | None = None) -> str:
    """The page. ``items``: ``status.supervisor_status`` dicts; ``lag``: supervisor -> partition
    -> records behind, as the runtimes last observed it."""
    now = now or datetime.now(UTC)
    ok, body = health
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="refresh" content="{REFRESH}">',
        "<title>stream-reconciler</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>stream-reconciler</h1>",
        _health(ok, body, now),
        "<h2>Supervisors</h2>",
        _supervisors(items, lag),
        "<h2>Recent resets</h2>",
        _resets(resets),
        f'<p class=muted>Refreshes every {REFRESH}s. Machine-readable: <a href="/healthz">/healthz</a>, '
        '<a href="/metrics">/metrics</a>, <code>reconciler status -o json</code>.</p>',
        "</body></html>",
    ]
    return "\n".join(parts)


def _health(ok: bool, body: Mapping[str, Any], now: datetime) -> str:
    word = '<span class=ok>healthy</span>' if ok else '<span class=bad>unhealthy</span>'
    out = [f'<p id=health>Daemon: {word}, role <b>{escape(str(body.get("role")))}</b>, '
           f'page at {now:%Y-%m-%d %H:%M:%S}Z.</p>']
    problems = body.get("problems") or []
    if problems:
        out.append("<ul class=err>" + "".join(f"<li>{escape(str(p))}</li>" for p in problems) + "</ul>")
    return "\n".join(out)


def _supervisors(items: Sequence[Mapping[str, Any]], lag: Mapping[str, Mapping[str, float]]) -> str:
    if not items:
        return "<p class=muted>No supervisors yet: add a spec to the spec directory.</p>"
    head = ("<table id=supervisors><thead><tr><th>supervisor</th><th>kind</th><th>state</th><th>datasource</th>"
            "<th>lag</th><th>records</th><th>backfill</th><th>last error</th></tr></thead><tbody>")
    rows = [_supervisor_row(s, lag.get(str(s["id"]), {})) for s in items if s.get("state") != "TERMINATED"]
    gone = sum(1 for s in items if s.get("state") == "TERMINATED")
    tail = "</tbody></table>"
    if gone:
        tail += f"<p class=muted>{gone} terminated supervisor(s) not shown.</p>"
    return head + "".join(rows) + tail


def _supervisor_row(s: Mapping[str, Any], lag: Mapping[str, float]) -> str:
    sid = escape(str(s["id"]))
    kind = escape(str(s["kind"])) + (f" of {escape(str(s['parent']))}" if s.get("parent") else "")
    state = escape(str(s["state"]))
    if s.get("detailedState") and s["detailedState"] != s["state"]:
        state += f'<br><span class=muted>{escape(str(s["detailedState"]))}</span>'
    lag_cell = _lag(s, lag)
    error = s.get("lastError") or s.get("streamError") or ""
    return (f'<tr id="sup-{sid}"><td><b>{sid}</b></td><td>{kind}</td><td>{state}</td>'
            f'<td>{escape(str(s.get("datasource") or ""))}</td><td class=num>{lag_cell}</td>'
            f'<td class=num>{int(s.get("records") or 0):,}</td><td>{_backfill(s.get("backfill"))}</td>'
            f'<td class=err>{escape(str(error))}</td></tr>')


def _lag(s: Mapping[str, Any], observed: Mapping[str, float]) -> str:
    if s.get("backfill"):
        b = s["backfill"]
        return f"{max(0, b['total'] - b['done']):,}"
    if s.get("lag") is not None:
        return f"{int(s['lag']):,}"
    if not observed:
        return '<span class=muted>?</span>'
    total = int(sum(observed.values()))
    per = ", ".join(f"{escape(p)}: {int(v):,}" for p, v in sorted(observed.items()))
    return f'{total:,}<br><span class=muted>{per}</span>'


def _backfill(b: Mapping[str, Any] | None) -> str:
    if not b:
        return ""
    total, done = int(b["total"]), int(b["done"])
    pct = 100.0 * done / total if total else 100.0
    text = f"{done:,} / {total:,} ({pct:.0f}%)"
    if b.get("complete"):
        text += " completed"
    else:
        if b.get("ratePerSecond"):
            text += f", {b['ratePerSecond']:,.0f}/s"
        if b.get("etaSeconds") is not None:
            text += f", ETA {_duration(b['etaSeconds'])}"
    return (f'<progress class=backfill max="{max(total, 1)}" value="{min(done, max(total, 1))}"></progress>'
            f"<br>{escape(text)}")


def _resets(entries: Sequence[Mapping[str, Any]]) -> str:
    if not entries:
        return "<p class=muted>None recorded.</p>"
    rows = []
    for e in entries:
        d = e.get("details") or {}
        what = []
        if d.get("position"):
            what.append(f"to {d['position']}")
        if d.get("backfill"):
            what.append(f"backfill {d['backfill']} ({int(d.get('backfillRecords') or 0):,} records)")
        if d.get("lostRecords"):
            what.append(f"{int(d['lostRecords']):,} records lost to retention")
        at = e["at"].strftime("%Y-%m-%d %H:%M:%S") + "Z" if isinstance(e.get("at"), datetime) else str(e.get("at"))
        rows.append(f"<tr><td>{escape(at)}</td><td>{escape(str(e['supervisor_id']))}</td>"
                    f"<td>{escape(str(e['action']))}</td><td>{escape(str(e.get('actor') or ''))}</td>"
                    f"<td>{escape('; '.join(what))}</td><td>{escape(str(e.get('reason') or ''))}</td></tr>")
    return ("<table id=resets><thead><tr><th>at</th><th>supervisor</th><th>action</th><th>by</th><th>what</th>"
            "<th>reason</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
