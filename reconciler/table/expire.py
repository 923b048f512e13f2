"""Snapshot expiry: drop snapshots older than a cut-off beyond the last N, and delete the
files only they referenced. The offset ranges the expired snapshots carried are folded
(adjacent ranges merged, overlaps and gaps kept) into the table property
``reconciler.expired-ranges``, so exactly once can still be proven from the table
(``expired_ranges``)."""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.table import Table
from pyiceberg.table.update.snapshot import ExpireSnapshots

from reconciler.table.catalog import (
    SUPERVISOR,
    Tables,
    local_path,
    summary_ranges,
)
from reconciler.table.reach import _ManifestReader, _unlink
from reconciler.table.reports import _camel

log = logging.getLogger(__name__)

EXPIRED_RANGES = "reconciler.expired-ranges"  # table property: {supervisor: [[p, s, e], ...]}
DEFAULT_SNAPSHOT_AGE = timedelta(days=7)
DEFAULT_RETAIN_LAST = 100
COMMIT_ATTEMPTS = 10


@dataclass
class ExpireResult:
    table: str
    dry_run: bool
    expired_snapshots: int = 0
    retained_snapshots: int = 0
    deleted_files: list[str] = field(default_factory=list)
    committed: bool = False
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _camel(asdict(self) | {"deletedFileCount": len(self.deleted_files)})


def expire_snapshots(
    tables: Tables,
    name: str,
    *,
    older_than: timedelta = DEFAULT_SNAPSHOT_AGE,
    retain_last: int = DEFAULT_RETAIN_LAST,
    now: datetime | None = None,
    dry_run: bool = False,
    attempts: int = COMMIT_ATTEMPTS,
) -> ExpireResult:
    """Remove the snapshots of table ``name`` that are older than ``older_than`` AND not
    among the last ``retain_last``, then delete the files only they referenced.

    Never expired: the current snapshot, branch and tag heads, and every snapshot that
    was the current one at some time after the cut-off (a reader may still hold it). A file still live in any retained snapshot is never deleted. The offset
    ranges of expired snapshots are kept, merged, in the table property
    ``reconciler.expired-ranges`` (committed with the expiry)."""
    if retain_last < 1:
        raise ValueError("retain_last must be at least 1")
    now = now or datetime.now(UTC)
    cutoff_ms = int((now - older_than).timestamp() * 1000)
    result = ExpireResult(table=name, dry_run=dry_run)
    for attempt in range(1, attempts + 1):
        table = tables.load(name)
        if table is None:
            result.message = f"no table {name}"
            return result
        metadata = table.metadata
        protected = {ref.snapshot_id for ref in metadata.refs.values()}
        if metadata.current_snapshot_id is not None:
            protected.add(metadata.current_snapshot_id)
        protected |= _recently_current(metadata, cutoff_ms)
        newest = sorted(metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0), reverse=True)
        protected |= {s.snapshot_id for s in newest[:retain_last]}
        expired = [s for s in metadata.snapshots if s.snapshot_id not in protected and s.timestamp_ms < cutoff_ms]
        retained = [s for s in metadata.snapshots if s.snapshot_id not in {e.snapshot_id for e in expired}]
        result.expired_snapshots, result.retained_snapshots = len(expired), len(retained)
        if not expired:
            result.message = "no snapshot to expire"
            return result
        reader = _ManifestReader(table.io)
        keep = reader.reachable(retained, live_only=True)
        gone = reader.reachable(expired, live_only=True) - keep
        # Manifest lists and manifests of expired snapshots, when no retained one shares them.
        result.deleted_files = sorted(gone)
        if dry_run:
            result.message = f"would expire {len(expired)} snapshot(s) and delete {len(gone)} file(s)"
            return result
        folded = fold_ranges(expired_ranges(table), _snapshot_ranges(expired))
        try:
            tx = table.transaction()
            ExpireSnapshots(tx).by_ids([s.snapshot_id for s in expired]).commit()
            tx.set_properties({EXPIRED_RANGES: json.dumps(folded, separators=(",", ":"), sort_keys=True)})
            tx.commit_transaction()
        except (CommitFailedException, ValidationException) as exc:
            log.info("expiry of %s: the table moved (%s); again", name, exc)
            time.sleep(min(0.05 * attempt, 0.5))
            continue
        result.committed = True
        for path in gone:
            _unlink(local_path(path))
        result.message = f"expired {len(expired)} snapshot(s), deleted {len(gone)} file(s)"
        log.info("maintenance of %s: %s", name, result.message)
        return result
    result.message = f"gave up after {attempts} attempts: the table kept moving"
    return result


def expired_ranges(table: Table) -> dict[str, list[tuple[str, int, int]]]:
    """The offset ranges of expired snapshots, per supervisor (``verify`` adds them to the
    ranges of the snapshots still in the table)."""
    raw = table.properties.get(EXPIRED_RANGES)
    if not raw:
        return {}
    return {sid: [(str(p), int(s), int(e)) for p, s, e in ranges] for sid, ranges in json.loads(raw).items()}


def fold_ranges(*sources: Mapping[str, Iterable[tuple[str, int, int]]]) -> dict[str, list[list]]:
    """Ranges per supervisor with adjacent ones merged (``[a, b)`` + ``[b, c)`` = ``[a, c)``);
    overlapping and non-adjacent ranges stay apart, so overlaps and gaps remain visible."""
    merged: dict[str, dict[str, list[list[int]]]] = defaultdict(lambda: defaultdict(list))
    for src in sources:
        for sid, ranges in src.items():
            for p, s, e in ranges:
                merged[sid][str(p)].append([int(s), int(e)])
    out: dict[str, list[list]] = {}
    for sid, parts in sorted(merged.items()):
        rows = []
        for p, spans in sorted(parts.items()):
            spans.sort()
            cur = spans[0][:]
            for s, e in spans[1:]:
                if s == cur[1]:
                    cur[1] = e
                else:
                    rows.append([p, *cur])
                    cur = [s, e]
            rows.append([p, *cur])
        out[sid] = rows
    return out


def _snapshot_ranges(snapshots) -> dict[str, list[tuple[str, int, int]]]:
    out: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for s in snapshots:
        props = s.summary.additional_properties if s.summary else {}
        ranges = summary_ranges(props)
        if ranges and props.get(SUPERVISOR):
            out[props[SUPERVISOR]] += ranges
    return out


def _recently_current(metadata, cutoff_ms: int) -> set[int]:
    """Snapshots that were the table's current one at some time after the cut-off (a
    reader that loaded the table then may still be reading them)."""
    log_entries = sorted(metadata.snapshot_log, key=lambda e: e.timestamp_ms)
    out = set()
    for i, entry in enumerate(log_entries):
        until = log_entries[i + 1].timestamp_ms if i + 1 < len(log_entries) else None
        if until is None or until >= cutoff_ms:
            out.add(entry.snapshot_id)
    return out
