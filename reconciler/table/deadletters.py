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


@dataclass
class DeadFile:
    """One live data file of the dead-letter table, its supervisor and its rows."""

    task: Any  # pyiceberg FileScanTask
    supervisor: str | None
    rows: pa.Table  # DEAD_SCHEMA

    @property
    def path(self) -> str:
        return self.task.file.file_path


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


def listing(datasource: str, files: Sequence[DeadFile], replayed: int, *, samples: int = SAMPLES) -> dict[str, Any]:
    """``deadletter list``'s document: counts by reason kind and by supervisor, the first
    ``samples`` records of each kind, and how many were replayed already."""
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
            if len(shown[kind]) < samples:
                shown[kind].append({"partition": cols["partition"][i], "offset": cols["offset"][i],
                                    "supervisor": cols["supervisor"][i], "key": preview(keys[i].as_py()),
                                    "value": preview(values[i].as_py()),
                                    "reason": printable(secrets.scrub(cols["reason"][i] or ""))})
    return {"datasource": datasource, "deadLetters": sum(by_reason.values()), "replayed": replayed,
            "byReason": [{"reason": printable(k), "count": n, "records": shown[k]}
                         for k, n in by_reason.most_common()],
            "bySupervisor": [{"supervisor": k, "count": n} for k, n in sorted(by_supervisor.items())]}


def count_reasons(reasons: Iterable[str | None]) -> dict[str, int]:
    return dict(collections.Counter(reason_kind(r) for r in reasons).most_common())
