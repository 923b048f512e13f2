"""One supervisor's page (``GET /supervisors/<id>``): its partitions, charts, recent batches and
audit entries. Pure like ``statuspage`` (the HTTP handler gathers the data), with the same rules:
no scripts, nothing fetched, every value escaped, sources never shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

from reconciler.observe.charts import duration
from reconciler.observe.render import (
    is_ranges,
    offset_range,
    plural,
    ranges_text,
    reset_sentence,
    trigger_beside,
)
from reconciler.observe.statuspage import (
    Samples,
    backfill_cell,
    charts,
    lag_time,
    last_commit,
    markers,
    override_note,
    page_head,
    policy_cell,
    state_badge,
)

BATCHES_SHOWN = 20


def render(item: Mapping[str, Any], *, observed: Mapping[str, Any] | None, samples: Samples,
           batches: Sequence[Mapping[str, Any]], audit: Sequence[Mapping[str, Any]], now: datetime | None = None) -> str:
    """``item``: a ``status.supervisor_status`` dict; ``observed``: the lag observer's last
    observation (with ``partitions``); ``samples``: its samples of the last hour (the charts, the
    same as the status page's); ``batches``: the newest committed batches, newest first (the table
    shows ``BATCHES_SHOWN``); ``audit``: the newest audit entries, newest first."""
    now = now or datetime.now(UTC)
    sid = str(item["id"])
    done = item.get("kind") == "backfill" and item.get("state") == "COMPLETED"  # it ingests nothing any more
    parts = [
        page_head(f"{sid} · stream-reconciler"),
        f'<p><a href="/">&larr; all supervisors</a></p><h1 id=supervisor>{escape(sid)}</h1>',
        f"<p class=state>{state_badge(str(item['state']))}{override_note(item)}</p>",
        _summary(item, observed),
        "<h2>Lag and ingestion</h2>",
        f"<div id=charts>{charts(samples, now, markers=markers(audit, sid), width=370, height=150, done=done)}"
        "</div>",
        "<h2>Partitions</h2>",
        _partitions(item, observed),
        "<h2>Recent batches</h2>",
        _batches(batches[:BATCHES_SHOWN]),
        "<h2>Audit log</h2>",
        _audit(audit),
        "</body></html>",
    ]
    return "\n".join(parts)


def _summary(s: Mapping[str, Any], observed: Mapping[str, Any] | None) -> str:
    rows = [
        ("state", f"{s['state']}" + (f" ({s['detailedState']})" if s.get("detailedState") != s["state"] else "")
         + (f" (by operator: {s['override'].get('reason') or ''})" if s.get("override") else "")),
        ("kind", str(s["kind"]) + (f" of {s['parent']}" if s.get("parent") else "")),
        ("datasource", str(s.get("datasource") or "")),
        ("epoch", str(s.get("epoch"))),
        ("spec", f"{s.get('specHash')} {s.get('specPath') or ''}"),
        ("records ingested", f"{int(s.get('records') or 0):,} ({int(s.get('unparseable') or 0):,} unparseable, "
                             f"{plural(int(s.get('batches') or 0), 'batch')})"),
    ]
    if s.get("lostRecords"):
        rows.append(("lost to retention", f"{int(s['lostRecords']):,} records"))
    dl = s.get("deadLetters") or {}
    if dl.get("pending"):
        rows.append(("dead letters", f"{int(dl['pending']):,} pending"
                     + (f", last reason: {dl['lastReason']}" if dl.get("lastReason") else "")
                     + f" (see `{dl['command']}`)"))
    if s.get("lagUnknown"):
        rows.append(("lag", str(s["lagUnknown"])))
    if s.get("lastError") or s.get("streamError"):
        rows.append(("last error", str(s.get("lastError") or s.get("streamError"))))
    html = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    html += f"<tr><th>lag in time</th><td class=lag-seconds>{lag_time(s, observed)}</td></tr>"
    html += f"<tr><th>last commit</th><td class=last-commit>{last_commit(s)}</td></tr>"
    if s.get("lagPolicy"):
        html += f"<tr><th>lag policy</th><td class=policy>{policy_cell(s['lagPolicy'])}</td></tr>"
    if s.get("backfill"):
        html += f"<tr><th>backfill</th><td>{backfill_cell(s['backfill'])}</td></tr>"
    return f"<table id=summary>{html}</table>"


def _partitions(s: Mapping[str, Any], observed: Mapping[str, Any] | None) -> str:
    seen = {p["partition"]: p for p in (observed or {}).get("partitions", ())}
    rows = []
    for p in s.get("partitions") or ():
        o = seen.get(p["partition"], {})
        target = p.get("end") if p.get("end") is not None else o.get("target", p.get("latest"))
        lag = p.get("lag") if p.get("lag") is not None or s.get("lagUnknown") else o.get("records")
        secs = p.get("lagSeconds") if p.get("lagSeconds") is not None or s.get("lagUnknown") else o.get("seconds")
        rows.append(f'<tr><td>{escape(str(p["partition"]))}</td><td class=num>{_n(p.get("checkpoint"))}</td>'
                    f"<td class=num>{_n(target)}</td><td class=num>{_n(lag)}</td>"
                    f'<td class=num>{escape(duration(secs)) if secs is not None else "?"}</td></tr>')
    if not rows:
        return "<p class=muted>No checkpoint yet.</p>"
    # numeric headers aligned as their numbers: left over right put each value under the next header
    return ("<table id=partitions><thead><tr><th>partition</th><th class=num>checkpoint</th>"
            "<th class=num>latest / end</th><th class=num>lag</th><th class=num>lag in time</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _batches(batches: Sequence[Mapping[str, Any]]) -> str:
    if not batches:
        return "<p class=muted>No committed batch yet.</p>"
    rows = []
    for b in batches:
        ranges = ", ".join(f"{p} {offset_range(a, e)}" for p, a, e in b.get("ranges") or ())
        rows.append(f"<tr><td>{escape(_at(b.get('committed_at')))}</td><td><code>{escape(str(b['batch_id'])[:12])}"
                    f"</code></td><td class=num>{int(b.get('records') or 0):,}</td>"
                    f"<td class=num>{int(b.get('unparseable') or 0):,}</td><td class=num>{int(b.get('rows') or 0):,}</td>"
                    f"<td>{escape(ranges)}</td></tr>")
    return ("<table id=batches><thead><tr><th>committed</th><th>batch</th><th class=num>records</th>"
            "<th class=num>unparseable</th><th class=num>rows</th><th>offsets</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _audit(entries: Sequence[Mapping[str, Any]]) -> str:
    if not entries:
        return "<p class=muted>No audit entries.</p>"
    rows = []
    for e in entries:
        details = reset_sentence(e.get("details")) or details_text(e.get("details"))
        said = trigger_beside(e.get("actor"), e.get("trigger"))  # once, not the actor again
        trigger = f"<br><span class=muted>{escape(said)}</span>" if said else ""
        rows.append(f"<tr><td>{escape(_at(e.get('at')))}</td><td>{escape(str(e['action']))}</td>"
                    f"<td>{escape(str(e.get('actor') or ''))}{trigger}</td>"
                    f"<td>{escape(str(e.get('reason') or ''))}</td><td class=details>{escape(details)}</td></tr>")
    # a fixed layout: a long value (a spec's path, a token) wraps inside its column, where the
    # automatic one either widened the table past the window or squeezed the dates to a letter a line
    return ("<table id=audit><colgroup><col style=width:7.5em><col style=width:7.5em><col style=width:9.5em><col>"
            "<col style=width:36%></colgroup><thead><tr><th>at</th><th>action</th><th>by / trigger</th>"
            "<th>reason</th><th>details</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def details_text(details: Any, limit: int = 400) -> str:
    """An audit entry's details as short ``key: value`` text that wraps (raw JSON was one
    unbreakable line off-screen at 900 px): ``a: 1; b (c: 2, d: 3); e: [4, 5]``."""
    if not details:
        return ""
    if not isinstance(details, Mapping):
        text = _value(details)
    else:
        text = "; ".join(_pair(k, v) for k, v in sorted(details.items()) if v not in (None, {}, []))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _pair(key: Any, value: Any) -> str:
    if key == "fingerprint" and is_ranges(value):  # (offset, epoch ms) per partition, not a range
        return fingerprint_text(value)
    if is_ranges(value):  # offsets as everywhere else: [125,000, 137,500)
        return f"{key}: {ranges_text(value)}"
    return f"{key} ({_value(value)})" if isinstance(value, Mapping) else f"{key}: {_value(value)}"


def fingerprint_text(marks: Mapping[str, Any]) -> str:
    """A ``source-fingerprint`` entry's ``{partition: [offset, timestamp ms]}`` in words: as a
    range it read ``0 [49,999, 1,795,875,046,286)``, a time grouped by thousands."""
    out = []
    for p, (offset, ms) in marks.items():
        try:
            written = datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            at = f"offset {int(offset):,}"
        except (TypeError, ValueError, OverflowError, OSError):  # an entry of another shape: as it is
            written, at = str(ms), f"offset {offset}"
        out.append(f"partition {p}: the record at {at} written {written}")
    return ", ".join(out)


def _value(v: Any) -> str:
    if isinstance(v, Mapping):
        return ", ".join(_pair(k, x) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(f"({_value(x)})" if isinstance(x, Mapping) else _value(x) for x in v) + "]"
    return str(v)


def _n(v: Any) -> str:
    return "?" if v is None else f"{int(v):,}"


def _at(v: Any) -> str:
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"
    return str(v or "")
