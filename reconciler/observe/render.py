"""Human-readable rendering of plans, status, history and segments (tables on stdout).

Machine-readable output is JSON of the same dictionaries (``-o json``), exact; this module
only lays them out for people. Text a person or a broker supplied (a reason, a file name,
an error a client library returned) passes ``printable`` first: control characters (C0,
DEL, C1, ESC), line and paragraph separators and the bidirectional overrides are shown as
escapes (``\n``, ``\x1b``, ``\u202e``), so no value can start a forged line of
``history``, recolour a terminal or reorder what a person reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from reconciler.logs import printable, printable_lines

__all__ = ["printable", "printable_lines", "table", "plan_text", "reset_table", "status_text", "spark_text",
           "spec_origin", "reset_sentence", "last_reset_text", "history_text", "segments_text"]


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, wrap_last: int | None = None) -> str:
    """Columns padded to their widest cell; with ``wrap_last``, the last column is wrapped at
    word boundaries to that many characters (continuation lines indented under it), so a
    long error is read whole instead of cut mid-word."""
    rows = [[printable(v) for v in r] for r in rows]
    cells = [[*r[:-1], _wrap(r[-1], wrap_last)] for r in rows] if wrap_last else [[*r[:-1], [r[-1]]] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers[:-1])]
    widths.append(max([len(headers[-1])] + [len(x) for r in cells for x in r[-1]]))
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)).rstrip()  # noqa: E731
    out = [line(list(headers)), line(["-" * w for w in widths])]
    for r in cells:
        first, *more = r[-1] or [""]
        out.append(line([*r[:-1], first]))
        out.extend(line([""] * (len(widths) - 1) + [x]) for x in more)
    return "\n".join(out)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def plan_text(plan: dict[str, Any]) -> str:
    out = []
    if not plan["actions"]:
        out.append("No changes: the database matches the spec directory.")
    for a in plan["actions"]:
        head = f"{a['kind']:<19} {printable(a['supervisor']):<24} {printable(a['reason'])}"
        if a.get("path"):
            head += f"  [{printable(a['path'])}]"
        out.append(head)
        if a.get("error"):
            out.extend("    " + line for line in printable_lines(a["error"]))
        if "partitions" in a:
            out.append(_indent(reset_table(a["partitions"]), 4))
            out.append(f"    backfill {a['backfillRecords']} records, skip {a['skippedRecords']}, "
                       f"re-read {a['rereadRecords']}")
        for w in a.get("warnings", []) + a.get("errors", []):
            out.append(f"    ! {printable(w)}")
    for n in plan["notes"]:
        out.append(f"note: {printable(n)}")
    for d in plan.get("policies") or ():
        out.append(f"lag policy {d['supervisor']}: {_policy_text(d['policy'])}: {d['status']}: {d['message']}")
    return "\n".join(out)


def _policy_text(policy: dict[str, Any]) -> str:
    """``maxRecords 20000, for 0s, resetToLatestAndBackfill, cooldown 10m``."""
    parts = [f"{k} {policy[k]}" for k in ("maxRecords", "maxLag", "for") if k in policy]
    parts.append(str(policy.get("action", "alert")))
    parts += [f"{k} {policy[k]}" for k in ("cooldown", "backfillTaskCount") if k in policy]
    return ", ".join(parts)


def reset_table(partitions: list[dict[str, Any]]) -> str:
    """``new source``: records below the checkpoint of a source that started over, read once
    (shown only when there are any, where ``reread`` would otherwise have counted them)."""
    renewed = any(p.get("renewed") for p in partitions)
    return table(
        ["partition", "checkpoint", "latest", "new", "backfill", "skipped", "reread"] + (["new source"] if renewed else []),
        [[p["partition"], p["checkpoint"], p["latest"], p["new"], p["backfill"], p["skipped"], p["reread"]]
         + ([p.get("renewed", 0)] if renewed else []) for p in partitions],
    )


def status_text(items: list[dict[str, Any]], detail: bool, live: bool = True, lag_asked: bool = True) -> str:
    """``live``: a daemon leads now; otherwise each state is shown as last seen, with when.
    ``lag_asked``: False under ``--no-lag``: a lag nobody asked for is ``-``, not the ``?`` of
    a broker that is down or a source that started over."""
    if not items:
        return "No supervisors. Add a spec to the spec directory and run `reconciler apply`."
    unasked = "?" if lag_asked else "-"
    rows = []
    # each error is said once, under the table: a broker that is down fails every supervisor
    # reading from it with the same words, as its last error (a daemon runs) or as the stream error
    notes: dict[str, list[str]] = {}
    for s in items:
        lag = unasked if s["lag"] is None else s["lag"]
        progress = ""
        if s.get("backfill"):
            b = s["backfill"]
            progress = f"{b['done']}/{b['total']}"
            if b["ratePerSecond"]:
                progress += f" {b['ratePerSecond']:,.0f}/s"
            if b["complete"]:
                progress += " COMPLETED"
            elif b["etaSeconds"] is not None:
                progress += f" eta {b['etaSeconds']:.0f}s"
        state = s["state"] if live or not s.get("updatedAt") else f"{s['state']} (as of {_hhmmss(s['updatedAt'])})"
        if s.get("override"):
            state += " (by operator)"
        age = unasked if s.get("lagSeconds") is None else _age(s["lagSeconds"])
        error = s["lastError"] or s["streamError"] or ""
        if error:
            notes.setdefault(error, []).append(s["id"])
            error = ("" if s["lastError"] else "lag unknown: ") + f"see [{list(notes).index(error) + 1}] below"
        rows.append([s["id"], state, s["detailedState"], lag, age, s["records"], s["unparseable"], progress, error])
    out = [table(["supervisor", "state", "detail", "lag", "lag age", "records", "unparseable", "backfill", "error"],
                 rows, wrap_last=80)]
    for n, (message, ids) in enumerate(notes.items(), 1):
        who = ids[0] if len(ids) == 1 else f"{len(ids)} supervisors ({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})"
        out.append(f"[{n}] {who}: {printable(message)}")
    if "-" in (r[3] for r in rows) or "-" in (r[4] for r in rows):
        out.append("lag -: not asked of the brokers (--no-lag)")
    for s in items:  # a state shown other than the one stored says why (observe.status.settle)
        if s.get("stateNote"):
            out.append(f"{s['id']}: {printable(s['stateNote'])}")
    for s in items:  # a "?" says why: here, a source that started over (never a false 0)
        if s.get("lagUnknown"):
            out.append(f"{s['id']}: lag {printable(s['lagUnknown'])}")
    for s in items:  # a policy that has something to say (breached, pending, acting) stays in view
        d = s.get("lagPolicy")
        if d and d["status"] not in ("ok", "unobserved", "suspended"):
            out.append(f"{s['id']}: lag policy {d['status']}: {d['message']}")
    # Loss is never silent: it stays in view for as long as the supervisor exists.
    for s in items:
        if s.get("lostRecords"):
            out.append(f"{s['id']}: LOST {s['lostRecords']} records deleted by the broker's retention before "
                       f"they were ingested (`reconciler history {s['id']}` has the ranges)")
        dl = s.get("deadLetters") or {}
        if dl.get("pending"):
            why = f" (last reason: {printable(dl['lastReason'])})" if dl.get("lastReason") else ""
            out.append(f"{s['id']}: {dl['pending']} dead letter(s) pending{why}: `{dl['command']}`")
        if s.get("sourceRestarts"):
            out.append(f"{s['id']}: its source started over below the checkpoint {s['sourceRestarts']} time(s) "
                       f"(re-created or truncated; `reconciler history {s['id']}` has what was re-read and lost)")
    if detail:
        for s in items:
            out.append(f"\n{s['id']} ({s['kind']}{', from ' + s['parent'] if s['parent'] else ''}), "
                       f"epoch {s['epoch']}, spec {s['specHash']} {spec_origin(s)}")
            out.append(table(["partition", "checkpoint", "latest", "end", "lag", "lag age"],
                             [[p["partition"], p["checkpoint"], p["latest"], p["end"],
                               unasked if p["lag"] is None else p["lag"],
                               unasked if p.get("lagSeconds") is None else _age(p["lagSeconds"])]
                              for p in s["partitions"]]))
            if s.get("lagPolicy"):
                d = s["lagPolicy"]
                out.append(f"lag policy: {_policy_text(d['policy'])}: {d['status']}: {d['message']}")
            if s.get("lastCommitAt"):
                out.append(f"last commit of {s['datasource']}: {_hhmmss(s['lastCommitAt'])} "
                           f"({_age(s['lastCommitAgeSeconds'])} ago)")
            said = s["lastError"] or s["streamError"]  # the error its [n] under the table says
            n = list(notes).index(said) + 1 if said else 0
            if s["lastError"]:
                out.append(f"last error (the daemon's last step): see [{n}] above")
            if s["streamError"]:
                # a broker that is down fails the daemon's step and this command's question alike
                same = same_problem(s["streamError"], said)
                out.append("the broker, asked now by this command: "
                           + (f"the same ([{n}])" if same else printable(s["streamError"])))
            if s.get("override"):
                out.append(f"override: {printable(s['override']['description'])} (drift from the file until "
                           f"`reconciler resume {s['id']}`)")
    return "\n".join(out)


_UNREACHABLE = ("cannot reach", "did not answer within", "no answer from the stream within")


def same_problem(a: str, b: str) -> bool:
    """Two errors that say the same thing to a person: the same words once numbers (a timeout,
    a port, a count of brokers) are set aside, or both that the broker cannot be reached."""
    if re.sub(r"\d+", "#", a) == re.sub(r"\d+", "#", b):
        return True
    return any(w in a for w in _UNREACHABLE) and any(w in b for w in _UNREACHABLE)


def spark_text(spark: dict[str, Any]) -> str:
    """One line: ``status.spark_state`` in words (an unknown value is left out, never "None")."""
    app = f", application {printable(spark['appId'])}" if spark.get("appId") else ""
    since = f" since {_hhmmss(spark['since'])}" if spark.get("since") else ""
    head = f"spark: {printable(spark.get('state') or 'unknown')}{since} (master {printable(spark.get('master') or '?')}{app})"
    if not spark.get("running") and spark.get("since"):
        head = f"spark: no daemon is running; the last one's session {printable(spark.get('state') or '')}" \
               f" at {_hhmmss(spark['since'])} (master {printable(spark.get('master') or '?')}{app})"
    return head + (f": {printable(spark['reason'])}" if spark.get("reason") else "")


def spec_origin(s: dict[str, Any]) -> str:
    """Where a supervisor's spec comes from: its file, or, for a backfill (which has none: it is
    kept in the database), the reset that generated it."""
    if s.get("specPath"):
        return printable(s["specPath"])
    if s.get("kind") == "backfill":
        when = f" at {_hhmmss(s['createdAt'])}" if s.get("createdAt") else ""
        parent = printable(s.get("parent") or "its main supervisor")
        return f"(no file: generated by a reset of {parent}{when}; `reconciler history {parent}` has it)"
    return "(no file)"


def reset_sentence(details: Any) -> str | None:
    """A reset's audit details as one sentence (where to, each partition's move, the backfill and
    its ranges, what was skipped, re-read or lost); None when ``details`` are not a reset's."""
    if not isinstance(details, dict) or "token" not in details or not isinstance(details.get("partitions"), list):
        return None
    if details.get("appliedBefore"):
        return "already applied earlier (the same request): nothing changed"
    parts = [p for p in details["partitions"] if isinstance(p, dict)]
    moves = [f"{printable(p.get('partition'))} {_num(p.get('checkpoint'))} → {_num(p.get('new'))}"
             for p in parts if p.get("new") != p.get("checkpoint")]
    where = f" to {printable(details['position'])}" if details.get("position") else ""
    out = f"reset{where}: " + (f"partition {', '.join(moves)}" if moves else "no checkpoint moved")
    if details.get("backfill"):
        ranges = ", ".join(f"{printable(p.get('partition'))} {offset_range(_backfill_start(p), p.get('new'))}"
                           for p in parts if p.get("backfill"))
        out += (f"; backfill {printable(details['backfill'])} ingests {_num(details.get('backfillRecords', 0))} "
                f"records ({ranges or 'none'})")
    for key, words in (("skipped", "skipped, no backfill"), ("reread", "read a second time (rewind)")):
        n = sum(int(p.get(key) or 0) for p in parts)
        if n:
            out += f"; {n:,} records {words}"
    if details.get("lostRecords"):
        lost = ranges_text(details.get("lostRanges") or {})
        out += f"; {_num(details['lostRecords'])} records LOST to the broker's retention ({lost})"
    for w in details.get("warnings") or ():
        out += f"; {printable(w)}"
    return out


def last_reset_text(entry: dict[str, Any]) -> str:
    """``status ID``'s line for the supervisor's last reset (an audit entry)."""
    when = entry["at"] if isinstance(entry["at"], str) else entry["at"].isoformat()
    who = f" by {printable(entry['actor'])}" if entry.get("actor") else ""
    why = f"; reason: {printable(entry['reason'])}" if entry.get("reason") else ""
    sentence = reset_sentence(entry.get("details")) or printable(entry.get("action"))
    return f"last reset, {_hhmmss(when)}{who}: {sentence}{why}"


def _backfill_start(p: dict[str, Any]) -> Any:
    """Where a partition's backfill begins: the checkpoint, or the broker's earliest when the
    retention deleted what lay between (``earliest`` recorded in the same transaction)."""
    cp, earliest = p.get("checkpoint"), p.get("earliest")
    return max(cp, earliest) if isinstance(cp, int) and isinstance(earliest, int) else cp


def offset_range(start: Any, end: Any) -> str:
    """A range of offsets, one way on the pages and in ``history``: half-open, as the design
    defines it, with thousands separators (``create-backfill`` showed ``[125000, 137500]``
    beside its reset's ``[125,000, 137,500)``)."""
    return f"[{_num(start)}, {_num(end)})"


def ranges_text(ranges: Any) -> str:
    """``{partition: [start, end]}`` (an audit entry's ``ranges``, ``lostRanges``) as
    ``0 [125,000, 137,500), 1 [...)``."""
    return ", ".join(f"{printable(p)} {offset_range(*r)}" for p, r in ranges.items())


def is_ranges(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(
        isinstance(r, (list, tuple)) and len(r) == 2 for r in value.values())


def plural(n: int, word: str) -> str:
    """``1 batch``, ``2 batches``, ``1,000 records``."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}{'es' if word.endswith(('s', 'ch', 'sh', 'x')) else 's'}"


def trigger_beside(actor: Any, trigger: Any) -> str | None:
    """The trigger to show beside the actor, unless it only repeats it: a CLI reset's actor is
    ``cli:root (operation 27ead4fd2645)`` and its trigger ``cli: root (operation 27ead4fd2645)``."""
    if not trigger:
        return None
    source = str(trigger).split(": ", 1)[-1]
    return None if actor and source in str(actor) else str(trigger)


def _plain_ranges(ranges: Any) -> str:
    return printable(", ".join(f"{p}: [{a}, {b})" for p, (a, b) in ranges.items()))


def _num(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else printable(v if v is not None else "?")


def webhooks_text(hooks: list[dict[str, Any]]) -> str:
    """One line per webhook endpoint: delivering, or failing since when and why."""
    out = []
    for h in hooks:
        if h["failing"]:
            out.append(f"webhook {printable(h['endpoint'])}: FAILING since {_hhmmss(h['failingSince'])}: "
                       f"{printable(h['lastError'])}; "
                       f"{h['pending']} event(s) waiting")
        else:
            when = f", last delivered at {_hhmmss(h['deliveredAt'])}" if h.get("deliveredAt") else ""
            out.append(f"webhook {printable(h['endpoint'])}: ok{when}; {h['pending']} event(s) waiting")
    return "\n".join(out)


def _age(seconds: float) -> str:
    """``0`` -> ``0s``; ``5040`` -> ``1h24m``."""
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def history_text(entries: list[dict[str, Any]]) -> str:
    if not entries:
        return "No history."
    out = []
    for e in entries:
        trigger = trigger_beside(e["actor"], e["trigger"])
        out.append(f"{e['at']:%Y-%m-%d %H:%M:%S}Z  {printable(e['action']):<19} by {printable(e['actor'])}"
                   + (f"  trigger: {printable(trigger)}" if trigger else "")
                   + (f"  reason: {printable(e['reason'])}" if e["reason"] else ""))
        d = e.get("details") or {}
        if d.get("partitions"):
            out.append(_indent(reset_table(d["partitions"]), 4))
        if d.get("backfill"):
            out.append(f"    backfill supervisor: {printable(d['backfill'])} ({d.get('backfillRecords', 0)} records)")
        # ``history``'s lines keep the form scripts have read since the first release (plain
        # counts, ``0: [a, b)``); the pages' sentences are the ones with separators
        if is_ranges(d.get("ranges")):  # a backfill's own entry: the range it ingests
            out.append(f"    ranges: {_plain_ranges(d['ranges'])}")
        if d.get("lostRecords"):
            out.append(f"    LOST {d['lostRecords']} records deleted by the broker's retention before they were "
                       f"ingested ({_plain_ranges(d.get('lostRanges') or {})})")
    return "\n".join(out)


def segments_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "No committed segments."
    out = []
    for r in rows:
        ranges = ", ".join(f"{p}:[{s},{e})" for p, s, e in json.loads(r["ranges"]))
        if ranges and r.get("rangesFrom") == "batch":  # no __partition/__offset statistics to narrow them
            ranges += " (the batch's)"
        out.append([f"{r['interval_start']}/{r['interval_end']}", r["rows"], r["bytes"], r["batch_id"][:12], ranges, r["path"]])
    return table(["interval", "rows", "bytes", "batch", "offsets", "path"], out)


def _hhmmss(iso: str) -> str:
    """``2026-11-23T13:22:01.5+00:00`` -> ``13:22:01Z`` (the day too when it is not today)."""
    from datetime import UTC, datetime

    when = datetime.fromisoformat(iso)
    when = (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC)
    return f"{when:%H:%M:%S}Z" if when.date() == datetime.now(UTC).date() else f"{when:%Y-%m-%d %H:%M:%S}Z"


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())
