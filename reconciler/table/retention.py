"""A table's history kept short as it commits, so that a commit costs the same after a day
of one-second batches as after the first.

Every commit writes the whole table metadata again: its snapshot list, its metadata log,
its properties. Kept for an hour at one commit a second, 3,600 snapshots made each
metadata file several MiB and each publish a large part of a second. So:

* each publish expires, in the same staged metadata, the snapshots beyond the newest
  ``keep`` (with some slack, so it happens every few commits, not every one), folding
  their offset ranges into ``reconciler.expired-ranges`` exactly as ``expire_snapshots``
  does (``verify`` keeps covering them). The current snapshot and branch and tag heads
  are never expired, nor, with a reader's grace, the snapshot current in any version of
  the metadata log (``grace.py``: a reader may hold those versions);
* after the commit, the files only the expired snapshots needed are deleted
  (``superseded``): their manifest lists, the manifests no kept snapshot lists, the data
  files a compaction replaced once no kept snapshot sees them, and the metadata files
  that fell out of the metadata log. A file a kept snapshot may need is never deleted;
* manifests are merged every ``MERGE_MIN_COUNT`` commits (Iceberg's merge append) into
  manifests of at most ``MANIFEST_TARGET_BYTES``, and the metadata log keeps
  ``PREVIOUS_VERSIONS`` entries. A merge rewrites every entry of the manifests it merges,
  and a merged manifest keeps being merged until it reaches the target size: at Iceberg's
  8 MiB (about 27,000 data files) a merge every 16 commits rewrote up to 27,000 entries,
  seconds in pyiceberg, a stall that grew with the table's live files. Capped at 256 KiB
  (600 to 1,400 files, by the table's columns), a merge costs under 0.3 s whatever the history (figures in
  benchmarks/README.md, ``commit_growth.py``); the manifest list holds a manifest per
  ~600-1,400 live files instead.

Files named here are deleted only after the commit is durable; a crash in between leaves
them to orphan clean-up, which sees them unreferenced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pyiceberg.table.update.snapshot import ExpireSnapshots

from reconciler.table import grace, summary

DEFAULT_KEPT = 25  # settings.snapshotsKept
SLACK = 5  # expire when the history exceeds keep + SLACK, down to keep
PREVIOUS_VERSIONS = 10
MERGE_MIN_COUNT = 16
MANIFEST_TARGET_BYTES = 256 * 1024

PROPERTIES = {  # what every table's properties converge to (set at creation, else at the next publish)
    "write.metadata.previous-versions-max": str(PREVIOUS_VERSIONS),
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": str(MERGE_MIN_COUNT),
    "commit.manifest.target-size-bytes": str(MANIFEST_TARGET_BYTES),
}


def converge_properties(tx) -> None:
    """Bring a table created by an older version to ``PROPERTIES`` (once)."""
    have = tx.table_metadata.properties
    missing = {k: v for k, v in PROPERTIES.items() if have.get(k) != v}
    if missing:
        tx.set_properties(missing)


def expire_beyond(tx, keep: int, readers: bool = False) -> list[int]:
    """Within ``tx`` (after its new snapshot is added): expire the snapshots beyond the newest
    ``keep`` when more than ``SLACK`` of them may go; returns their ids. With ``readers`` (a
    reader's grace), the snapshot current in the version ``tx`` is staged on or in any
    version of its metadata log may not go (``grace.log_snapshots``)."""
    if keep <= 0:
        return []
    metadata = tx.table_metadata
    snapshots = sorted(metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms))
    if len(snapshots) <= keep + SLACK:
        return []
    protected = {ref.snapshot_id for ref in metadata.refs.values()}
    if metadata.current_snapshot_id is not None:
        protected.add(metadata.current_snapshot_id)
    if readers:
        base = tx._table  # the version staged on: it and its log hold the new log, and one more
        protected |= grace.log_snapshots(base.metadata, base.metadata_location, base.io)
    expired = [s for s in snapshots[:-keep] if s.snapshot_id not in protected]
    if len(expired) <= SLACK:  # every few commits, also when some are held for readers
        return []
    folded = summary.fold_expired(metadata.properties, [_props(s) for s in expired])
    ExpireSnapshots(tx).by_ids([s.snapshot_id for s in expired]).commit()
    tx.set_properties(folded)
    return [s.snapshot_id for s in expired]


def superseded(base, new, reader) -> list[str]:
    """The files ``base`` (the metadata before a commit) needed and ``new`` (after it) does
    not: what may be deleted once the commit is durable. ``reader`` reads manifest lists
    and manifests (``reach._ManifestReader``, cached by path)."""
    kept_ids = {s.snapshot_id for s in new.snapshots}
    expired = [s for s in base.snapshots if s.snapshot_id not in kept_ids]
    out: set[str] = set()
    if expired:
        kept = [s for s in new.snapshots]
        kept_manifests = {m.manifest_path for s in kept for m in reader.manifests(s, missing_ok=True)}
        expired_ids = {s.snapshot_id for s in expired}
        for s in expired:
            out.add(s.manifest_list)
            out |= {m.manifest_path for m in reader.manifests(s, missing_ok=True)} - kept_manifests
        # A kept snapshot's parent, read from ``base``: expiring a parent makes pyiceberg null
        # the parent id of the snapshots it keeps, so in ``new`` a compaction that outlives
        # its parent would never be found, nor later when it expires itself (its files left
        # to orphan clean-up). A snapshot this commit added had the base's current as parent.
        parents = {s.snapshot_id: s.parent_snapshot_id for s in base.snapshots}

        def parent(s) -> int | None:
            if s.snapshot_id in parents:
                return parents[s.snapshot_id]
            return s.parent_snapshot_id if s.parent_snapshot_id is not None else base.current_snapshot_id

        replaced = _replaced(reader, [s for s in [*expired, *kept] if parent(s) in expired_ids])
        if replaced:
            # A kept snapshot older than the expired parent (a tag's or a branch's head, a
            # current snapshot rolled back to) may still list a replaced file.
            live = _live(reader, kept)
            out |= replaced - live if live is not None else set()
    out |= _dropped_metadata(base, new)
    return sorted(out)


def unused(written: Iterable[str], location: str, new, reader) -> list[str]:
    """Files a staging wrote that its own metadata (at ``location``) does not reference: a
    merge append writes the new files' manifest, then merges it into a bigger one and lists
    only that."""
    referenced = {location, *_referenced_by_new(new, reader)}
    return sorted(f for f in written if f not in referenced)


def _referenced_by_new(new, reader) -> set[str]:
    out = set()
    for s in new.snapshots:
        out.add(s.manifest_list)
        out |= {m.manifest_path for m in reader.manifests(s, missing_ok=True)}
    return out


def _replaced(reader, snapshots: Iterable) -> set[str]:
    """Data files the given snapshots deleted (a compaction's inputs). Once each one's parent
    is expired, only a kept snapshot older than that parent can see them (a ref's head):
    ``superseded`` keeps the ones still live in any kept snapshot."""
    out: set[str] = set()
    for s in snapshots:
        props = _props(s)
        deleted = int(s.summary.get("deleted-data-files", "0") or 0) if s.summary else 0
        if not deleted and props.get(summary.OPERATION) != "compact":
            continue
        for m in reader.manifests(s, missing_ok=True):
            if m.added_snapshot_id != s.snapshot_id:
                continue
            out |= reader.deleted_files(m)
    return out


def _live(reader, snapshots: Iterable) -> set[str] | None:
    """The data files live in any of ``snapshots``; None when one cannot be read (then no
    replaced file is deleted: orphan clean-up judges them later)."""
    out: set[str] = set()
    try:
        for s in snapshots:
            for m in reader.manifests(s):
                out |= reader.data_files(m, live_only=True)
    except FileNotFoundError:
        return None
    return out


def _dropped_metadata(base, new) -> set[str]:
    """Metadata files in ``base``'s log that ``new``'s log no longer names (Iceberg's
    ``write.metadata.delete-after-commit``, done here after our own commit)."""
    before = {e.metadata_file for e in base.metadata_log}
    after = {e.metadata_file for e in new.metadata_log}
    return before - after


def _props(snapshot) -> Mapping[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}

