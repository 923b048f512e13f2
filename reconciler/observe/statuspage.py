"""The daemon's status page (``GET /`` on the ``http`` address): one server-rendered HTML page.

What an operator opens during an incident: the daemon's health and its webhooks, every
supervisor with its state (coloured: fine, unhealthy, suspended), lag in records and in time,
under it charts of lag in records, lag in time and records ingested per second over the data
held (at most the last hour, inline SVG with a time axis and the resets and backfills marked,
``charts``), the age of its table's last commit, its lag policy, backfill progress
and ETA, its last error, and the recent resets and, apart, the recent alerts from the audit log
(a lag hovering at its threshold once pushed a team's reset off a shared list); each links to a
page of its own (``supervisorpage``: partitions, recent batches, audit entries). It refreshes
itself every ``REFRESH`` seconds. No scripts, no front-end build, nothing fetched from
elsewhere; every value is HTML-escaped, sources are not shown (errors were scrubbed of secrets
before they were stored), and the page is served on the same loopback address as ``/metrics``.

``render`` is pure: the HTTP handler gathers the data (``status.all_status`` without broker
calls, the lag observer's last observations and samples, the audit log) and hands it in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

from reconciler.observe.charts import Marker, duration, ingest_rates, span_start, timechart

# the lag observer's samples (``lagwatch.Sample``): (time, records, seconds, records ingested so far)
Samples = Sequence[tuple[datetime, int | None, float | None, int | None]]

REFRESH = 5  # seconds
# the "Recent resets and backfills" list: what moved a checkpoint or a backfill (an operator's
# suspend or resume is in the supervisor's own audit log, not here)
RESET_ACTIONS = ("reset", "reset-and-backfill", "retention-loss", "reject-request", "fresh-start",
                 "cancel-backfill", "suspend-backfill", "resume-backfill")
ALERT_ACTIONS = ("lag-breach", "lag-breach-end", "unhealthy", "recovered")  # a list of their own (issue 41.7)

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:20px;margin:0 0 .3em} h2{font-size:16px;margin:1.4em 0 .4em}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:.3em .6em;border-bottom:1px solid #ddd;
vertical-align:top} th{background:#f4f4f4} td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#176c2f} .bad{color:#b3261e;font-weight:600} .muted{color:#777}
.err{color:#b3261e;overflow-wrap:break-word} td.err{white-space:nowrap} td.policy{min-width:8em;max-width:16em} td.policy:empty{min-width:0}
#supervisors th{white-space:nowrap} #errors{padding-left:1.2em;list-style:none}
progress{width:7em} code{font-size:13px} svg.chart{display:block;flex:none}
a{color:#1a4f8b} .warn{color:#8a5a00;font-weight:600}
.st{font-weight:600;padding:.05em .4em;border-radius:3px;white-space:nowrap;background:#eee;color:#444}
.st-RUNNING,.st-IDLE{background:#e3f2e6;color:#176c2f} .st-PENDING{background:#fff1d0;color:#7a5000}
.st-UNHEALTHY_SUPERVISOR,.st-UNHEALTHY_TASKS{background:#b3261e;color:#fff} .st-SUSPENDED{background:#7a7a7a;color:#fff}
#supervisors tr.sup td{border-bottom:none} #supervisors td.charts{padding-top:0}
div.charts{display:flex;flex-wrap:wrap;gap:6px 10px}
#audit{table-layout:fixed} #audit td{overflow-wrap:anywhere} #partitions{width:auto;min-width:40em}
@media (max-width:1000px){#supervisors{font-size:13px} #supervisors th,#supervisors td{padding:.25em .4em}}
"""


def render(items: Sequence[Mapping[str, Any]], resets: Sequence[Mapping[str, Any]], health: tuple[bool, Mapping],
           lag: Mapping[str, Mapping[str, float]], now: datetime | None = None, *,
           observed: Mapping[str, Mapping[str, Any]] | None = None, history: Mapping[str, Samples] | None = None,
           webhooks: Sequence[Mapping[str, Any]] = (), alerts: Sequence[Mapping[str, Any]] = ()) -> str:
    """The page. ``items``: ``status.supervisor_status`` dicts; ``lag``: supervisor -> partition
    -> records behind, as the runtimes last observed it; ``observed``: the lag observer's last
    observation per supervisor (``records``, ``seconds``, ``at``); ``history``: its samples of
    the last hour; ``webhooks``: the endpoints' delivery state; ``resets`` and ``alerts``: the
    newest audit entries of ``RESET_ACTIONS`` and of ``ALERT_ACTIONS``, each its own list."""
    now = now or datetime.now(UTC)
    ok, body = health
    notes = error_notes(items, body.get("failing") or {})
    parts = [
        page_head("stream-reconciler"),
        "<h1>stream-reconciler</h1>",
        _health(ok, body, now, notes),
        _webhooks(webhooks),
        "<h2>Supervisors</h2>",
        _supervisors(items, lag, observed or {}, history or {}, now, resets, notes),
        "<h2>Recent resets and backfills</h2>",
        _resets(resets),
        "<h2>Recent alerts</h2>",
        _resets(alerts, table="alerts", notes=notes),
        f'<p class=muted>Refreshes every {REFRESH}s. Machine-readable: <a href="/healthz">/healthz</a>, '
        '<a href="/metrics">/metrics</a>, <code>reconciler status -o json</code>.</p>',
        "</body></html>",
    ]
    return "\n".join(parts)


def page_head(title: str) -> str:
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f'<meta http-equiv="refresh" content="{REFRESH}">'
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>")


def _webhooks(hooks: Sequence[Mapping[str, Any]]) -> str:
    if not hooks:
        return ""
    rows = []
    for h in hooks:
        if h.get("failing"):
            what = (f'<span class=bad>failing</span> since {escape(str(h.get("failingSince") or ""))}: '
                    f'{escape(str(h.get("lastError") or ""))}')
        else:
            what = '<span class=ok>delivering</span>'
        rows.append(f'<li>webhook <code>{escape(str(h["endpoint"]))}</code>: {what}; '
                    f'{int(h.get("pending") or 0):,} event(s) waiting</li>')
    return "<ul id=webhooks>" + "".join(rows) + "</ul>"


def charts(samples: Samples, now: datetime, *, markers: Sequence[Marker] = (), width: int = 260,
           height: int = 96, done: bool = False) -> str:
    """The three charts of one supervisor on one time axis: lag in records, lag in time, records
    ingested per second (``charts.ingest_rates`` of the samples: this page and the supervisor's
    own draw the same figures). ``done``: it ingests nothing any more (a completed backfill)."""
    size = {"width": width, "height": height, "markers": markers,
            "since": span_start([s[0] for s in samples], now)}
    totals = [(s[0], s[3] if len(s) > 3 else None) for s in samples]
    # done: nothing is ingested since its end, a known 0/s (unobserved, it read "now ?"); a sample
    # made up at "now" moved with every rendering, and so did its range's peak (issue 46.4)
    ingested = ingest_rates(totals, now, done=done)
    return ("<div class=charts>"
            + timechart([(s[0], s[1]) for s in samples], now, label="lag (records)", css_class="chart lag-records",
                        **size)
            + timechart([(s[0], s[2]) for s in samples], now, label="lag (time)", unit="s", color="#c0621b",
                        css_class="chart lag-seconds", **size)
            + timechart(ingested, now, label="ingested/s", unit="/s", color="#2f8a4a",
                        css_class="chart ingest-rate", reduce="mean", **size)
            + "</div>")


def markers(entries: Sequence[Mapping[str, Any]], sid: str) -> list[Marker]:
    """The resets and backfills of one supervisor among audit entries, for its charts' time axis:
    its own resets, and a backfill's start (its ``create-backfill``, or the reset that made it)."""
    out = []
    for e in entries:
        at, action, d = e.get("at"), str(e.get("action")), e.get("details") or {}
        if not isinstance(at, datetime):
            continue
        own = str(e.get("supervisor_id", sid)) == sid
        kind = None
        if own and action in ("reset", "reset-and-backfill", "fresh-start", "retention-loss"):
            kind = "reset"
        elif (own and action == "create-backfill") or (action == "reset-and-backfill" and d.get("backfill") == sid):
            kind = "backfill"
        if kind is not None:
            what = f" (backfill {d['backfill']})" if action == "reset-and-backfill" and own and d.get("backfill") else ""
            out.append(Marker(at, kind, f"{action}{what} at {at:%H:%M:%S}Z by {e.get('actor') or '?'}: "
                                        f"{e.get('reason') or ''}"))
    return out


def state_badge(state: str) -> str:
    """The state, coloured: fine (green), pending (amber), unhealthy (red), suspended (grey)."""
    css = "".join(c for c in state if c.isalnum() or c == "_")
    return f'<span class="st st-{css}">{escape(state).replace("_", "_<wbr>")}</span>'


def override_note(s: Mapping[str, Any]) -> str:
    """An operator's suspend (``reconciler suspend``), under the badge as the CLI says it: a file's
    ``suspended: true`` and an operator's looked the same, the reason only in the audit log."""
    o = s.get("override")
    if not o:
        return ""
    return (f'<br><span class="muted override" title="{escape(str(o.get("description") or ""))}">'
            f'by operator: {escape(str(o.get("reason") or ""))}</span>')


def error_notes(items: Sequence[Mapping[str, Any]], failing: Mapping[str, str]) -> dict[str, list[str]]:
    """Each distinct error once, with the supervisors it concerns, in order: a broker that is down
    fails every supervisor reading from it with the same words, which the page said in full once
    per supervisor in the health list and again in each row (issue 46)."""
    notes: dict[str, list[str]] = {}
    for sid, error in failing.items():
        notes.setdefault(str(error), []).append(str(sid))
    for s in items:
        error = s.get("lastError") or s.get("streamError")
        if error and s.get("state") != "TERMINATED" and str(s["id"]) not in notes.get(str(error), ()):
            notes.setdefault(str(error), []).append(str(s["id"]))
    return notes


def _health(ok: bool, body: Mapping[str, Any], now: datetime, notes: Mapping[str, Sequence[str]] = {}) -> str:  # noqa: B006
    word = '<span class=ok>healthy</span>' if ok else '<span class=bad>unhealthy</span>'
    out = [f'<p id=health>Daemon: {word}, role <b>{escape(str(body.get("role")))}</b>, '
           f'page at {now:%Y-%m-%d %H:%M:%S}Z.</p>']
    failing = {f"{sid}: {err}" for sid, err in (body.get("failing") or {}).items()}
    problems = [p for p in body.get("problems") or [] if str(p) not in failing]  # the failing ones are notes
    if problems:
        out.append("<ul class=err>" + "".join(f"<li>{escape(str(p))}</li>" for p in problems) + "</ul>")
    if notes:
        out.append("<ol id=errors class=err>" + "".join(
            f'<li id="err-{n}">[{n}] <b>{escape(_who(ids))}</b>: {escape(text)}</li>'
            for n, (text, ids) in enumerate(notes.items(), 1)) + "</ol>")
    return "\n".join(out)


def _who(ids: Sequence[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def _supervisors(items: Sequence[Mapping[str, Any]], lag: Mapping[str, Mapping[str, float]],
                 observed: Mapping[str, Mapping[str, Any]], history: Mapping[str, Samples], now: datetime,
                 audit: Sequence[Mapping[str, Any]] = (), notes: Mapping[str, Sequence[str]] = {}) -> str:  # noqa: B006
    if not items:
        return "<p class=muted>No supervisors yet: add a spec to the spec directory.</p>"
    # kind and datasource under the name, the charts in a row of their own: readable at 900 px
    head = ("<table id=supervisors><thead><tr><th>supervisor</th><th>state</th><th class=num>lag</th>"
            "<th class=num>lag in time</th><th class=num>last commit</th><th class=num>records</th><th>backfill</th>"
            "<th>lag policy</th><th>last error</th></tr></thead><tbody>")
    numbers = {text: n for n, text in enumerate(notes, 1)}
    rows = [_supervisor_row(s, lag.get(str(s["id"]), {}), observed.get(str(s["id"])), history.get(str(s["id"]), ()),
                            now, markers(audit, str(s["id"])), numbers)
            for s in items if s.get("state") != "TERMINATED"]
    gone = sum(1 for s in items if s.get("state") == "TERMINATED")
    tail = "</tbody></table>"
    if gone:
        tail += f"<p class=muted>{gone} terminated supervisor(s) not shown.</p>"
    return head + "".join(rows) + tail


def _supervisor_row(s: Mapping[str, Any], lag: Mapping[str, float], observed: Mapping[str, Any] | None,
                    samples: Samples, now: datetime, marks: Sequence[Marker] = (),
                    numbers: Mapping[str, int] = {}) -> str:  # noqa: B006
    sid = escape(str(s["id"]))
    link = f'<a href="/supervisors/{quote(str(s["id"]))}"><b>{sid}</b></a>'
    kind = escape(str(s["kind"])) + (f" of {escape(str(s['parent']))}" if s.get("parent") else "")
    state = state_badge(str(s["state"]))
    if s.get("detailedState") and s["detailedState"] != s["state"]:
        # breakable at its underscores, as the badge: LOST_CONTACT_WITH_STREAM widened the table past 900 px
        state += f'<br><span class=muted>{escape(str(s["detailedState"])).replace("_", "_<wbr>")}</span>'
    state += override_note(s)
    lag_cell = _lag(s, lag, observed)
    error = str(s.get("lastError") or s.get("streamError") or "")
    n = numbers.get(error)
    error_cell = f'<a href="#err-{n}">see [{n}]</a>' if n else escape(error)  # said once, above the table
    return (f'<tr class=sup id="sup-{sid}"><td>{link}<br><span class="muted kind">{kind} &rarr; '
            f'{escape(str(s.get("datasource") or ""))}</span></td><td class=state>{state}</td>'
            f'<td class=num>{lag_cell}</td><td class="num lag-seconds">{lag_time(s, observed)}</td>'
            f'<td class="num last-commit">{last_commit(s)}</td>'
            f'<td class=num>{int(s.get("records") or 0):,}</td><td>{backfill_cell(s.get("backfill"))}</td>'
            f'<td class=policy>{policy_cell(s.get("lagPolicy"))}</td>'
            f'<td class=err>{error_cell}</td></tr>'
            f'<tr id="charts-{sid}"><td class=charts colspan=9>{charts(samples, now, markers=marks, done=_done(s))}</td></tr>')


def _done(s: Mapping[str, Any]) -> bool:
    return s.get("kind") == "backfill" and s.get("state") == "COMPLETED"


def lag_time(s: Mapping[str, Any], observed: Mapping[str, Any] | None) -> str:
    """The age of the oldest record not yet ingested, as last observed (``?``: not known)."""
    seconds = s.get("lagSeconds")
    if seconds is None and observed is not None and not s.get("lagUnknown"):
        seconds = observed.get("seconds")
    if seconds is None:
        return '<span class=muted>?</span>'
    return escape(duration(seconds))


def last_commit(s: Mapping[str, Any]) -> str:
    age = s.get("lastCommitAgeSeconds")
    if age is None:
        return '<span class=muted>none yet</span>'
    return f'{escape(duration(age))} ago'


def policy_cell(d: Mapping[str, Any] | None) -> str:
    if not d:
        return ""
    status = str(d.get("status"))
    css = {"ok": "ok", "pending": "warn", "alert": "bad", "due": "bad", "backfill-running": "warn",
           "cooling": "warn", "applied": "warn", "recovering": "warn", "error": "bad"}.get(status, "muted")
    return f'<span class={css}>{escape(status)}</span><br><span class=muted>{escape(str(d.get("message") or ""))}</span>'


def _lag(s: Mapping[str, Any], runtime: Mapping[str, float], observed: Mapping[str, Any] | None = None) -> str:
    if s.get("backfill"):
        b = s["backfill"]
        return f"{max(0, b['total'] - b['done']):,}"
    if s.get("lagUnknown"):  # before the observer's figure, which is latest minus checkpoint: a false 0
        return f'<span class=muted title="{escape(str(s["lagUnknown"]))}">?</span>'
    if s.get("lag") is not None:
        return f"{int(s['lag']):,}"
    if observed is not None and observed.get("records") is not None:
        return f"{int(observed['records']):,}"
    if observed is not None and observed.get("error"):  # the runtime's figure is from before: a false 0
        return '<span class=muted title="the broker did not answer">?</span>'
    if not runtime:
        return '<span class=muted>?</span>'
    total = int(sum(runtime.values()))
    per = ", ".join(f"{escape(p)}: {int(v):,}" for p, v in sorted(runtime.items()))
    return f'{total:,}<br><span class=muted>{per}</span>'


def backfill_cell(b: Mapping[str, Any] | None) -> str:
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
            text += f", ETA {duration(b['etaSeconds'])}"
    return (f'<progress class=backfill max="{max(total, 1)}" value="{min(done, max(total, 1))}"></progress>'
            f"<br>{escape(text)}")


def _same_alert(entries: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Neighbouring entries of one action with one reason, together: a broker that goes down makes
    every supervisor reading from it unhealthy in the same words, and the list said the whole
    error once per supervisor under the banner that had already said it once (issue 46)."""
    groups: list[list[Mapping[str, Any]]] = []
    for e in entries:
        last = groups[-1][0] if groups else None
        if last is not None and (last["action"], last.get("reason")) == (e["action"], e.get("reason")):
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def _resets(entries: Sequence[Mapping[str, Any]], table: str = "resets",
            notes: Mapping[str, Sequence[str]] | None = None) -> str:
    """``notes`` (the alerts): the banner's errors; same alerts are one row, a reason the banner
    says is pointed at."""
    if not entries:
        return "<p class=muted>None recorded.</p>"
    rows = []
    numbers = {text: n for n, text in enumerate(notes or {}, 1)}
    for group in _same_alert(entries) if notes is not None else [[e] for e in entries]:
        e = group[0]
        ids = list(dict.fromkeys(str(g["supervisor_id"]) for g in group))
        who = ids[0] if len(ids) == 1 else f"{len(ids)} supervisors: {_who(ids)}"
        n = numbers.get(str(e.get("reason") or ""))
        reason = f'<a href="#err-{n}">see [{n}] above</a>' if n else escape(str(e.get("reason") or ""))
        d = e.get("details") or {}
        what = []
        if d.get("position"):
            what.append(f"to {d['position']}")
        if d.get("backfill"):
            what.append(f"backfill {d['backfill']} ({int(d.get('backfillRecords') or 0):,} records)")
        if d.get("lostRecords"):
            what.append(f"{int(d['lostRecords']):,} records lost to retention")
        at = e["at"].strftime("%Y-%m-%d %H:%M:%S") + "Z" if isinstance(e.get("at"), datetime) else str(e.get("at"))
        rows.append(f"<tr><td>{escape(at)}</td><td>{escape(who)}</td>"
                    f"<td>{escape(str(e['action']))}</td><td>{escape(str(e.get('actor') or ''))}</td>"
                    f"<td>{escape('; '.join(what))}</td><td>{reason}</td></tr>")
    return (f"<table id={table}><thead><tr><th>at</th><th>supervisor</th><th>action</th><th>by</th><th>what</th>"
            "<th>reason</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
