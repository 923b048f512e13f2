"""Snapshot expiry: drop snapshots older than a cut-off beyond the last N, and delete the
files only they referenced. The offset ranges the expired snapshots carried are folded
(adjacent ranges merged, overlaps and gaps kept) into the table property
``reconciler.expired-ranges``, so exactly once can still be proven from the table
(``expired_ranges``)."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.update.snapshot import ExpireSnapshots

from reconciler import faults
from reconciler.errors import CommitOutcomeUnknown, ReconcilerError
from reconciler.store.batches import TableConflict
from reconciler.store.writes import WriteFenced
from reconciler.table import grace, summary
from reconciler.table.catalog import TableConflict as StagedOnAnother
from reconciler.table.catalog import (
    Tables,
)
from reconciler.table.reach import _ManifestReader, _unlink
from reconciler.table.reports import _camel
from reconciler.table.writeids import new_write_id

log = logging.getLogger(__name__)

EXPIRED_RANGES = summary.EXPIRED_RANGES
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
    store: Any,
    older_than: timedelta = DEFAULT_SNAPSHOT_AGE,
    retain_last: int = DEFAULT_RETAIN_LAST,
    now: datetime | None = None,
    dry_run: bool = False,
    attempts: int = COMMIT_ATTEMPTS,
) -> ExpireResult:
    """Remove the snapshots of table ``name`` that are older than ``older_than`` AND not
    among the last ``retain_last``, then delete the files only they referenced.

    Never expired: the current snapshot, branch and tag heads, every snapshot that was
    the current one at some time after the cut-off (a reader may still hold it) and, with
    a reader's grace, the one current in each version of the metadata log (grace.py). A
    file still live in any retained snapshot is never deleted. The offset ranges of
    expired snapshots are kept, merged, in the table property ``reconciler.expired-ranges``
    (committed with the expiry).

    The commit is a compare-and-swap on exactly the version the expiry was planned on
    (``Store.commit_tables``): a commit that landed meanwhile (a batch, a compaction,
    another expiry) makes it plan again, so two expiries never remove a snapshot twice
    nor lose each other's folded ranges. Files are deleted only after the commit, and only
    once readers had their grace (``grace.py``): until then, and by orphan clean-up after a
    restart."""
    if retain_last < 1:
        raise ValueError("retain_last must be at least 1")
    now = now or datetime.now(UTC)
    cutoff_ms = int((now - older_than).timestamp() * 1000)
    result = ExpireResult(table=name, dry_run=dry_run)
    write_id: str | None = None
    for attempt in range(attempts):
        if tables.load(name) is None:
            result.message = f"no table {name}"
            return result
        table = tables.current(name)
        metadata = table.metadata
        protected = {ref.snapshot_id for ref in metadata.refs.values()}
        if metadata.current_snapshot_id is not None:
            protected.add(metadata.current_snapshot_id)
        protected |= _recently_current(metadata, cutoff_ms)
        if tables.retired.grace > 0:  # a reader may hold any version of the metadata log (grace.py)
            protected |= grace.log_snapshots(metadata, table.metadata_location, table.io)
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
        folded = summary.fold_expired(table.properties, [_props(s) for s in expired])
        if write_id is None:
            write_id = new_write_id()
            store.begin_write(write_id, "expire", tables=[name])

        def build(tx, expired=expired, folded=folded):
            ExpireSnapshots(tx).by_ids([s.snapshot_id for s in expired]).commit()
            tx.set_properties(folded)

        commit = None
        try:
            # Staged on exactly the version planned on: a publish that expired snapshots
            # meanwhile (continuous expiry) removed ids planned here and folded their ranges
            # into properties this plan does not hold.
            commit = tables.stage(name, build, write_id=write_id, attempt=attempt, expected=table.metadata_location)
            faults.point("expire-commit", name)
            store.commit_tables(write_id, "expire", [commit])
        except (TableConflict, StagedOnAnother) as exc:
            if commit is not None:
                tables.discard_staged([commit])
            log.info("expiry of %s: the table moved (%s); again", name, exc)
            time.sleep(min(0.05 * (attempt + 1), 0.5))
            continue
        except WriteFenced as exc:
            result.message = str(exc)
            return result
        except CommitOutcomeUnknown as exc:
            faults.point("expire-unknown", name)
            if store.fence_write(write_id):
                tables.discard_staged([commit])
                result.message = f"commit outcome unknown ({exc}); not committed"
                return result
        tables.committed([commit])
        result.committed = True
        faults.point("expire-delete", name)
        tables.retired.retire(gone)  # a reader may still be on a version that lists them (grace.py)
        if tables.retired.grace > 0 and gone:
            # This process may exit first (``reconciler maintain``): then orphan clean-up deletes them.
            later = (f"{len(gone)} file(s) only they needed are kept for the readers' grace of "
                     f"{tables.retired.grace:g}s, then deleted (by the next orphan clean-up if this "
                     "process has exited)")
        else:
            later = f"{len(gone)} file(s) deleted"
        result.message = f"expired {len(expired)} snapshot(s); {later}"
        log.info("maintenance of %s: %s", name, result.message)
        return result
    if write_id is not None:
        _abandon(tables, store, name, write_id)
    result.message = f"gave up after {attempts} attempts: the table kept moving"
    return result


def _abandon(tables: Tables, store: Any, name: str, write_id: str) -> None:
    try:
        if store.fence_write(write_id):
            for f in tables.write_metadata_files(name, write_id):
                _unlink(f)
    except ReconcilerError as exc:
        log.warning("expiry of %s: write %s left for recovery (%s)", name, write_id, exc)


def expired_ranges(table: Table) -> dict[str, list[tuple[str, int, int]]]:
    """The offset ranges of expired snapshots, per supervisor (and generation: ``clicks@1``);
    ``verify`` adds them to the ranges of the snapshots still in the table."""
    return summary.expired_ranges(table.properties)


fold_ranges = summary.fold_ranges


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


def _props(snapshot) -> dict[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}
