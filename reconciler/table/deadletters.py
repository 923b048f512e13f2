"""Dead letters as a replay reads them and as ``reconciler deadletter list`` shows them.

A dead letter is a row of ``<D>_deadletter`` (partition, offset, key, value, reason). The
table does not name the supervisor that read it; its FILE does: a batch writes its dead
letters under ``data/batch=<batch id>/`` (the database's ``batches`` row names the
supervisor), and a replay writes the ones that still fail under
``data/compacted/<write id>/supervisor=<id>/``. A file from before either layout (the
old layout's import) belongs to the datasource's only supervisor lineage, or to none.

Reasons carry the value that failed (``unparseable timestamp (millis): 2026-...``): they
are counted by their kind, the text before the first ``": "``. Previews of keys and
values pass the secret scrubber and ``printable`` (control characters escaped), as every
other text we show.

Some dead letters no spec can bring back, and a replay leaves them as they are, reason and
all (``cannot_come_back``): an undecodable RabbitMQ entry's (the reader could not get
records out of the bytes; its reason names the entry, codec and offsets), and, under a
spec timed by ``__stream_time``, every one (a dead letter keeps no stream time).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan

from reconciler.errors import printable
from reconciler.model import BACKFILL_ID
from reconciler.pipeline.transform import DEAD_SCHEMA
from reconciler.spec import secrets
from reconciler.store.replays import batch_supervisors
from reconciler.table.catalog import Tables, deadletter_table
from reconciler.table.writeids import BATCH_DIR_PREFIX, COMPACTED_DIR

SUPERVISOR_DIR = "supervisor="
PREVIEW_BYTES = 64
SAMPLES = 3  # records shown per reason kind
_BATCH = re.compile(r"/data/" + re.escape(BATCH_DIR_PREFIX) + r"([^/]+)/")
_REPLAYED = re.compile(r"/data/" + COMPACTED_DIR + r"/[0-9a-f]{24}/" + re.escape(SUPERVISOR_DIR) + r"([^/]+)/")
# The reason the RabbitMQ reader gives the offsets of an entry it cannot decode
# (streams/rabbitmq/arrow.py ``_dead_letters``: "undecodable {what} at offsets [a, b): why",
# what being "sub-entry (codec)", "entry" or "chunk"). The cause is in the transport: the
# value is the entry's bytes (on its first offset) or nothing, never a record.
_UNDECODABLE = re.compile(r"undecodable (?:sub-entry \([^)]*\)|entry|chunk) at offsets \[\d+, \d+\)")
UNDECODABLE_WHY = "undecodable in the stream (the bytes hold no record): no spec change brings it back"
STREAM_TIME_WHY = "needs __stream_time, which dead letters do not keep"


@dataclass
class DeadFile:
    """One live data file of the dead-letter table, its supervisor and its rows."""

    task: Any  # pyiceberg FileScanTask
    supervisor: str | None
    rows: pa.Table  # DEAD_SCHEMA

    @property
    def path(self) -> str:
        return self.task.file.file_path


def lineage(supervisor_id: str) -> str:
    """The main supervisor of a backfill's id, or the id itself."""
    m = BACKFILL_ID.match(supervisor_id)
    return m.group("parent") if m else supervisor_id


def cannot_come_back(reason: str | None, data_schema: Any | None) -> str | None:
    """Why no replay under ``data_schema`` (None: unknown) can bring back a dead letter
    with ``reason``, or None when parsing it again may."""
    if reason is not None and _UNDECODABLE.match(reason):
        return UNDECODABLE_WHY
    if data_schema is not None and data_schema.timestamp_column == "__stream_time":
        return STREAM_TIME_WHY
    return None


def lineage_schemas(actual_supervisors: Mapping[str, Any], datasource: str) -> dict[str, Any]:
    """Main supervisor id -> the data schema its current spec parses ``datasource``'s dead
    letters with (a main whose spec is invalid or writes elsewhere now: absent)."""
    out = {}
    for sid, r in actual_supervisors.items():
        if (BACKFILL_ID.match(sid) or getattr(r, "spec_error", None) or r.spec is None
                or r.spec_document.get("dataSchema", {}).get("datasource") != datasource):
            continue
        out[sid] = r.spec.data_schema
    return out


def reason_kind(reason: str | None) -> str:
    """What a reason counts as: ``unparseable timestamp (millis)``, ``invalid JSON``, ..."""
    if not reason:
        return "?"
    return reason.split(": ", 1)[0][:120]


def preview(raw: bytes | None, limit: int = PREVIEW_BYTES) -> str | None:
    """The first ``limit`` bytes of a key or value as text fit to show."""
    if raw is None:
        return None
    text = raw[:limit].decode("utf-8", "replace")
    return printable(secrets.scrub(text)) + ("..." if len(raw) > limit else "")


def lineage_owner(actual_supervisors: Mapping[str, Any], datasource: str) -> str | None:
    """The one main supervisor writing ``datasource``, or None (none, or several)."""
    mains = [sid for sid, r in actual_supervisors.items()
             if str(r.kind) == "main" and r.spec_document.get("dataSchema", {}).get("datasource") == datasource]
    return mains[0] if len(mains) == 1 else None


def read(tables: Tables, store: Any, datasource: str, *, fallback: str | None = None,
         cache: dict[str, DeadFile] | None = None) -> tuple[Any, list[DeadFile]]:
    """The dead-letter table of ``datasource`` as it is now (None when there is none) and its
    live files with their rows. ``cache``: files already read, by path (files never change)."""
    name = deadletter_table(datasource)
    if tables.load(name) is None:
        return None, []
    table = tables.current(name)
    tasks = list(table.scan().plan_files())
    cache = cache if cache is not None else {}
    fresh = [t for t in tasks if t.file.file_path not in cache]
    owners = batch_supervisors(store, (m.group(1) for t in fresh if (m := _BATCH.search(t.file.file_path))))
    scan = ArrowScan(table.metadata, table.io, table.metadata.schema(), AlwaysTrue()) if fresh else None
    for t in fresh:
        rows = scan.to_table([t]).select(list(DEAD_SCHEMA.names)).cast(DEAD_SCHEMA)
        cache[t.file.file_path] = DeadFile(t, supervisor_of(t.file.file_path, owners, fallback), rows)
    return table, [cache[t.file.file_path] for t in tasks]


def supervisor_of(path: str, batch_owner: Mapping[str, str], fallback: str | None) -> str | None:
    m = _BATCH.search(path)
    if m is not None:
        return batch_owner.get(m.group(1), fallback)
    m = _REPLAYED.search(path)
    if m is not None:
        return m.group(1)
    return fallback


def listing(datasource: str, files: Sequence[DeadFile], replayed: int, *, samples: int = SAMPLES,
            schemas: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``deadletter list``'s document: counts by reason kind and by supervisor, the first
    ``samples`` records of each kind, how many were replayed already, and how many no
    replay can bring back and why (``schemas``: ``lineage_schemas``)."""
    schemas = schemas or {}
    stay: collections.Counter[str] = collections.Counter()
    by_reason: collections.Counter[str] = collections.Counter()
    by_supervisor: collections.Counter[str] = collections.Counter()
    shown: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    parts = []
    for f in files:
        by_supervisor[f.supervisor or "?"] += f.rows.num_rows
        parts.append(f.rows.append_column("supervisor", pa.array([f.supervisor] * f.rows.num_rows, pa.string())))
    rows = pa.concat_tables(parts).sort_by([("partition", "ascending"), ("offset", "ascending")]) if parts else None
    if rows is not None:
        cols = {c: rows.column(c).to_pylist() for c in ("partition", "offset", "reason", "supervisor")}
        keys, values = rows.column("key"), rows.column("value")
        for i in range(rows.num_rows):
            kind = reason_kind(cols["reason"][i])
            by_reason[kind] += 1
            sup = cols["supervisor"][i]
            why = cannot_come_back(cols["reason"][i], schemas.get(lineage(sup)) if sup else None)
            if why:
                stay[why] += 1
            if len(shown[kind]) < samples:
                shown[kind].append({"partition": cols["partition"][i], "offset": cols["offset"][i],
                                    "supervisor": cols["supervisor"][i], "key": preview(keys[i].as_py()),
                                    "value": preview(values[i].as_py()),
                                    "reason": printable(secrets.scrub(cols["reason"][i] or ""))})
    return {"datasource": datasource, "deadLetters": sum(by_reason.values()), "replayed": replayed,
            "byReason": [{"reason": printable(k), "count": n, "records": shown[k]}
                         for k, n in by_reason.most_common()],
            "bySupervisor": [{"supervisor": k, "count": n} for k, n in sorted(by_supervisor.items())],
            "cannotComeBack": [{"why": k, "count": n} for k, n in stay.most_common()]}


def count_reasons(reasons: Iterable[str | None]) -> dict[str, int]:
    return dict(collections.Counter(reason_kind(r) for r in reasons).most_common())
