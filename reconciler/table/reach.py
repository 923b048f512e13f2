"""What a table's metadata references: every metadata file in its log, and for each
version every snapshot's manifest list, manifests and data files. Expiry and orphan
clean-up decide what they may delete from it."""

from __future__ import annotations

import collections
import logging
import os
import threading

from pyiceberg.manifest import ManifestEntryStatus, ManifestFile
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table

from reconciler.table.locations import local_name

log = logging.getLogger(__name__)

class _Cache:
    """A bounded, thread-safe map from an immutable file's path to what was read from it.

    Iceberg's manifest lists and manifests are never rewritten in place (every write has
    a new name: pyiceberg's random UUID, or our write's tag), so what one read found stays
    true: expiry, orphan clean-up and verify, run again and again by a daemon, read each
    file once."""

    def __init__(self, size: int = 8192):
        self.size = size
        self._data: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def intern(self, key, value):
        """The value already held for ``key``, else ``value`` (now held)."""
        with self._lock:
            held = self._data.get(key)
            if held is not None:
                self._data.move_to_end(key)
                return held
            self._data[key] = value
            while len(self._data) > self.size:
                self._data.popitem(last=False)
            return value

    def get(self, key):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        return None

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


_LISTS = _Cache()
_ENTRIES = _Cache()
# One object per manifest, shared by every cached list that names it. pyiceberg shares them
# through a cache of 128 manifests only: a table listing more (manifests are capped at
# 256 KiB, so ~100 at 100,000 live files of a narrow table) made each cached list hold its own copies, ~800
# bytes a manifest, up to a GiB for 8,192 lists.
_MANIFESTS = _Cache(65536)


class _ManifestReader:
    """Files reachable from snapshots, each manifest list and manifest read once (and kept,
    by path, for the next reader: ``_Cache``). A missing manifest list or manifest is an
    error, unless ``missing_ok`` (snapshots of an older metadata version, whose expired
    files are already gone)."""

    def __init__(self, io):
        self.io = io

    def manifests(self, snapshot, missing_ok: bool = False) -> list[ManifestFile]:
        found = _LISTS.get(snapshot.manifest_list)
        if found is None:
            try:
                found = snapshot.manifests(self.io)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                return []
            found = [_MANIFESTS.intern(m.manifest_path, m) for m in found]
            _LISTS.put(snapshot.manifest_list, found)
        return found

    def data_files(self, manifest: ManifestFile, live_only: bool, missing_ok: bool = False) -> set[str]:
        key = (manifest.manifest_path, live_only)
        found = _ENTRIES.get(key)
        if found is None:
            try:
                entries = manifest.fetch_manifest_entry(self.io, discard_deleted=False)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                return set()
            found = frozenset(e.data_file.file_path for e in entries
                              if not live_only or e.status != ManifestEntryStatus.DELETED)
            _ENTRIES.put(key, found)
        return found

    def deleted_files(self, manifest: ManifestFile) -> frozenset[str]:
        """The data files a manifest records as deleted (a compaction's inputs)."""
        key = (manifest.manifest_path, "deleted")
        found = _ENTRIES.get(key)
        if found is None:
            try:
                entries = manifest.fetch_manifest_entry(self.io, discard_deleted=False)
            except FileNotFoundError:
                return frozenset()
            found = frozenset(e.data_file.file_path for e in entries if e.status == ManifestEntryStatus.DELETED)
            _ENTRIES.put(key, found)
        return found

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
        return os.path.abspath(local_name(location))
    except ValueError:
        return location


def _unlink(location: str | os.PathLike[str]) -> None:
    """Delete one file of a table that nothing needs (after an expiry committed, or an
    orphan), wherever the warehouse is (storage.py): best effort, absent is fine, and a file
    the store refuses to delete is left for the next clean-up."""
    from reconciler.table import storage

    try:
        storage.at(str(location)).delete([str(location)])
    except OSError as exc:
        log.warning("cannot delete %s (%s); left for the next clean-up", location, exc)
