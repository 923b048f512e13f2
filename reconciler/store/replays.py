"""What a dead-letter replay needs of the database: who read a batch's dead letters, the
replay's commit (both tables' pointers, the write and the audit entries in ONE
transaction), and the replays already recorded.

The commit is ``BatchesMixin.commit_tables`` plus the audit entries: a replay that
committed is always in the audit log, and one that did not never is (a crash between a
commit and a separate audit write would lose the entry, or a retry would write two).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from reconciler.store.base import utcnow
from reconciler.store.batches import _move_pointers
from reconciler.store.tables import audit_log, batches

REPLAY_ACTION = "deadletter-replay"  # the audit action; its webhook event is deadletter.replayed
IN_CHUNK = 500


def batch_supervisors(store: Any, batch_ids: Iterable[str]) -> dict[str, str]:
    """batch id -> the supervisor that committed it, for the committed batches among ``batch_ids``."""
    ids = sorted(set(batch_ids))
    out: dict[str, str] = {}
    for i in range(0, len(ids), IN_CHUNK):
        with store._read() as c:
            out.update(dict(c.execute(sa.select(batches.c.batch_id, batches.c.supervisor_id)
                                      .where(batches.c.batch_id.in_(ids[i:i + IN_CHUNK]))).all()))
    return out


def commit_replay(store: Any, write_id: str, table_commits: Sequence[Any], actor: str,
                  audits: Mapping[str, Mapping[str, Any]], *, reason: str | None = None) -> None:
    """Move the tables' pointers (compare-and-swap on each: ``TableConflict`` when one moved),
    finish write ``write_id`` (``WriteFenced`` when a clean-up took it) and record one audit
    entry per supervisor of ``audits`` (supervisor -> details), all or nothing."""
    with store._write() as c:
        _move_pointers(c, table_commits, f"replay {write_id}")
        store._finish_write(c, write_id, "replay")
        now = utcnow()
        for sid, details in sorted(audits.items()):
            store._audit(c, sid, REPLAY_ACTION, actor, "reconciler deadletter replay", reason, details, now)


def replayed_totals(store: Any, datasource: str | None = None) -> dict[str, dict[str, int]]:
    """Per supervisor (the one whose spec parsed them), per datasource: records replayed so far,
    from the audit log."""
    with store._read() as c:
        rows = c.execute(sa.select(audit_log.c.supervisor_id, audit_log.c.details)
                         .where(audit_log.c.action == REPLAY_ACTION)).all()
    out: dict[str, dict[str, int]] = {}
    for sid, details in rows:
        d = json.loads(details or "{}") or {}
        ds = str(d.get("datasource") or "")
        if datasource is not None and ds != datasource:
            continue
        per = out.setdefault(sid, {})
        per[ds] = per.get(ds, 0) + int(d.get("replayed") or 0)
    return out
