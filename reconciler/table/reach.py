"""What a table's metadata references: every metadata file in its log, and for each
version every snapshot's manifest list, manifests and data files. Expiry and orphan
clean-up decide what they may delete from it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pyiceberg.manifest import ManifestEntryStatus, ManifestFile
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table

from reconciler.table.catalog import (
    local_path,
)

log = logging.getLogger(__name__)

class _ManifestReader:
    """Files reachable from snapshots, each manifest list and manifest read once. A missing
    manifest list or manifest is an error, unless ``missing_ok`` (snapshots of an older
    metadata version, whose expired files are already gone)."""

    def __init__(self, io):
        self.io = io
        self._lists: dict[str, list[ManifestFile]] = {}
        self._entries: dict[tuple[str, bool], set[str]] = {}

    def manifests(self, snapshot, missing_ok: bool = False) -> list[ManifestFile]:
        if snapshot.manifest_list not in self._lists:
            try:
                self._lists[snapshot.manifest_list] = snapshot.manifests(self.io)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                return []
        return self._lists[snapshot.manifest_list]

    def data_files(self, manifest: ManifestFile, live_only: bool, missing_ok: bool = False) -> set[str]:
        key = (manifest.manifest_path, live_only)
        if key not in self._entries:
            try:
                entries = manifest.fetch_manifest_entry(self.io, discard_deleted=False)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                return set()
            self._entries[key] = {e.data_file.file_path for e in entries
                                  if not live_only or e.status != ManifestEntryStatus.DELETED}
        return self._entries[key]

    def reachable(self, snapshots, *, live_only: bool, missing_ok: bool = False) -> set[str]:
        out: set[str] = set()
        for s in snapshots:
            out.add(s.manifest_list)
            for m in self.manifests(s, missing_ok):
                out.add(m.manifest_path)
                out |= self.data_files(m, live_only, missing_ok)
        return {_norm(p) for p in out}


def _referenced(table: Table) -> set[str]:
    out = {_norm(table.metadata_location)}
    reader = _ManifestReader(table.io)
    versions = [table.metadata]
    for entry in table.metadata.metadata_log:
        out.add(_norm(entry.metadata_file))
        try:
            versions.append(FromInputFile.table_metadata(table.io.new_input(entry.metadata_file)))
        except (OSError, ValueError):
            continue
    seen: set[int] = set()
    for i, md in enumerate(versions):
        snaps = [s for s in md.snapshots if s.snapshot_id not in seen]
        seen |= {s.snapshot_id for s in snaps}
        out |= reader.reachable(snaps, live_only=False, missing_ok=i > 0)
        for stats in [*getattr(md, "statistics", []), *getattr(md, "partition_statistics", [])]:
            out.add(_norm(stats.statistics_path))
    return out


def _norm(location: str) -> str:
    try:
        return os.path.abspath(local_path(location))
    except ValueError:
        return location


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
