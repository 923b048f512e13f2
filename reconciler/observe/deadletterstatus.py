"""Dead letters in ``status`` and on the status pages: per main supervisor, how many of its
lineage's dead letters are pending (dead-lettered by its batches and its backfills', less
those replayed), the last reason a replay left, and the command that shows them.

From the database alone (batch totals and the audit log, one query each): ``status`` of a
thousand supervisors must not read a thousand tables. The lineage's totals come from
``batch_totals``, not from the items shown: ``status ID`` shows the main alone, and its
pending count must still count its backfills' dead letters (the audit log's replayed
count does)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from reconciler.model import BACKFILL_ID
from reconciler.store.replays import REPLAY_ACTION
from reconciler.store.tables import audit_log, batch_totals


def add(store: Any, items: Sequence[dict[str, Any]]) -> None:
    """Set ``deadLetters`` on each item of ``status`` (None for a backfill: its main shows them)."""
    with store._read() as c:
        rows = c.execute(sa.select(audit_log.c.supervisor_id, audit_log.c.details)
                         .where(audit_log.c.action == REPLAY_ACTION).order_by(audit_log.c.id)).all()
        totals = c.execute(sa.select(batch_totals.c.supervisor_id, batch_totals.c.unparseable)).all()
    replayed: dict[str, int] = {}
    last_reason: dict[str, str | None] = {}
    for sid, details in rows:
        d = json.loads(details or "{}") or {}
        replayed[sid] = replayed.get(sid, 0) + int(d.get("replayed") or 0)
        reasons = d.get("stayedByReason") or {}
        last_reason[sid] = max(reasons, key=reasons.get) if reasons else None
    dead: dict[str, int] = {}
    for sid, unparseable in totals:
        m = BACKFILL_ID.match(sid)
        main = m.group("parent") if m else sid
        dead[main] = dead.get(main, 0) + int(unparseable or 0)
    for item in items:
        if BACKFILL_ID.match(item["id"]):
            item["deadLetters"] = None
            continue
        pending = max(0, dead.get(item["id"], 0) - replayed.get(item["id"], 0))
        ds = item.get("datasource")
        item["deadLetters"] = {"pending": pending, "replayed": replayed.get(item["id"], 0),
                               "lastReason": last_reason.get(item["id"]) if pending else None,
                               "command": f"reconciler deadletter list {ds}" if pending and ds else None}
