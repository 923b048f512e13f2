"""The reader's grace: how long a file a commit unreferenced stays, for readers still on it.

A reader that loaded the table at one version (a long Trino query, DuckDB's
``iceberg_scan('<metadata file>')``) reads that version's metadata file, manifest lists,
manifests and data files, for as long as it runs. Each publish drops the metadata file 10
versions back and, every few commits, the snapshots beyond ``snapshotsKept`` with the files
only they needed (a compaction's inputs among them): at one commit a second, a version
stopped being reachable about 10 s after it stopped being current. So, with a grace:

* the snapshot current in any version of the metadata log (and in the current version) is
  never expired, by a publish or by ``maintain`` (``log_snapshots``): however few
  ``snapshotsKept``, a version among the last 10 keeps everything its current snapshot reads;
* what a commit unreferences is deleted only ``readerGrace`` seconds after the commit
  (default 10 minutes). The files a publish, a compaction or an expiry superseded are
  retired (``Retired``): kept in memory with the time they are due, deleted by the same
  best-effort path after a later commit or a maintenance run (the deletion still only ever
  follows a durable commit). A process that stops first leaves them to orphan clean-up;
* orphan clean-up treats as referenced everything a metadata file still on storage
  references while that version may still be read (``held_by_readers``). A version ``k``
  stopped being current when version ``k+1`` committed, and every metadata file of version
  ``k+2`` or later was written after that (it was staged on ``k+1``): the oldest such file's
  time bounds it from above, so a version is released only when that bound is more than the
  grace ago.

So a reader may hold a version as long as it likes while it is the current one or among the
10 before it (the metadata log), then ``readerGrace`` more. Without a grace (0) none of this
holds: what a commit unreferences goes at once.
"""

from __future__ import annotations

import bisect
import collections
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.manifest import read_manifest_list
from pyiceberg.serializers import FromInputFile

from reconciler.table.reach import _Cache, _ManifestReader, _norm

log = logging.getLogger(__name__)

DEFAULT_READER_GRACE = 600.0  # settings.readerGrace
# Files held in memory for their grace. Beyond it the oldest are forgotten, not deleted:
# orphan clean-up deletes them once their grace has passed (a day at several files a
# second; a path is ~100 bytes).
MAX_PENDING = 500_000
_VERSION = re.compile(r"(?:^|/)(\d+)-[^/]*\.metadata\.json$")


class Retired:
    """Files no version needs any more, each deleted once its grace has passed."""

    def __init__(self, grace: float, delete: Callable[[Sequence[str]], None],
                 clock: Callable[[], float] = time.monotonic, limit: int = MAX_PENDING):
        if grace < 0:
            raise ValueError(f"readerGrace must be 0 (off) or positive, not {grace}")
        self.grace = grace
        self._delete = delete
        self.clock = clock
        self.limit = limit
        self._lock = threading.Lock()
        self._due: collections.deque[tuple[float, tuple[str, ...]]] = collections.deque()
        self._count = 0

    def retire(self, files: Iterable[str] = (), now: float | None = None) -> None:
        """``files`` were unreferenced by a commit that is durable: delete them after the grace
        (at once without one), and whatever retired earlier is due now. Without files (the
        maintenance loop's tick): only what is due."""
        now = self.clock() if now is None else now
        files = tuple(files)
        due: list[str] = []
        forgotten = 0
        with self._lock:
            if files:
                self._due.append((now + self.grace, files))
                self._count += len(files)
            # In the order retired, so due in that order (one grace, a monotonic clock).
            while self._due and self._due[0][0] <= now:
                due.extend(self._due.popleft()[1])
            self._count -= len(due)
            while self._count > self.limit and len(self._due) > 1:
                dropped = len(self._due.popleft()[1])
                forgotten += dropped
                self._count -= dropped
        if forgotten:
            log.warning("%d superseded file(s) are past the %d held for the readers' grace; orphan clean-up "
                        "deletes them once the grace has passed", forgotten, self.limit)
        if due:
            self._delete(due)

    def pending(self) -> list[str]:
        with self._lock:
            return [f for _, fs in self._due for f in fs]


def version_of(metadata_location: str) -> int | None:
    m = _VERSION.search(metadata_location)
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class _Version:
    """What a metadata file says that the grace needs (a metadata file is never rewritten)."""

    current: int | None
    lists: tuple[str, ...]  # its snapshots' manifest lists


class _Listed:
    """A snapshot as reachability reads it: its manifest list (``_ManifestReader``)."""

    __slots__ = ("manifest_list",)

    def __init__(self, manifest_list: str):
        self.manifest_list = manifest_list

    def manifests(self, io) -> list:
        return list(read_manifest_list(io.new_input(self.manifest_list)))


_VERSIONS = _Cache(65536)  # metadata file -> _Version: an orphan run reads only new ones
_NAMES = _Cache(65536)  # one string per manifest list, shared by the versions that list it


def _summary(metadata) -> _Version:
    return _Version(metadata.current_snapshot_id,
                    tuple(_NAMES.intern(s.manifest_list, s.manifest_list) for s in metadata.snapshots))


def remember(location: str, metadata) -> None:
    """``metadata`` is what the file at ``location`` holds: no need to read it again."""
    _VERSIONS.put(location, _summary(metadata))


def _read(io, location: str) -> _Version | None:
    """The version a metadata file holds, or None when it cannot be read (deleted, or a
    staging's half-written file)."""
    found = _VERSIONS.get(location)
    if found is None:
        try:
            found = _summary(FromInputFile.table_metadata(io.new_input(location)))
        except (OSError, ValueError):
            return None
        _VERSIONS.put(location, found)
    return found


def log_snapshots(metadata, location: str, io) -> set[int]:
    """The snapshots current in the version ``metadata`` (at ``location``) and in each version
    of its metadata log: a reader may hold any of them, so none may be expired. A version
    that cannot be read is judged by the snapshot log: what was current when it was written."""
    remember(location, metadata)
    out = {metadata.current_snapshot_id} - {None}
    history = sorted(metadata.snapshot_log, key=lambda e: e.timestamp_ms)
    for entry in metadata.metadata_log:
        version = _read(io, entry.metadata_file)
        if version is not None:
            out |= {version.current} - {None}
            continue
        before = [e.snapshot_id for e in history if e.timestamp_ms <= entry.timestamp_ms]
        out |= set(before[-1:])
    return out


def held_by_readers(io, listed: Mapping[str, tuple[float, int]], now: float, grace: float,
                    current: str) -> set[str]:
    """Every file the metadata files in ``listed`` (path -> (mtime, size)) reference while a
    reader may still be on their version (the module's docstring), those files included.
    A version after ``current`` (the metadata location read before the listing) is a staging
    no reader has seen: its write's fence judges it, as before."""
    if grace <= 0:
        return set()
    newest = version_of(current)
    versions = sorted((v, path, st[0]) for path, st in listed.items()
                      if (v := version_of(path)) is not None and (newest is None or v <= newest))
    numbers = [v for v, _, _ in versions]
    # earliest[i]: the oldest file time among versions[i:], so among the versions k+2 and
    # later it is one lookup (one pass, not one scan per file).
    earliest = [float("inf")] * (len(versions) + 1)
    for i in range(len(versions) - 1, -1, -1):
        earliest[i] = min(earliest[i + 1], versions[i][2])
    released = now - grace
    held = [path for version, path, _ in versions
            if earliest[bisect.bisect_left(numbers, version + 2)] >= released]
    out = {_norm(path) for path in held}
    lists: dict[str, _Listed] = {}
    for path in held:
        version = _read(io, path)
        if version is not None:  # else nothing a reader holds
            lists.update((m, _Listed(m)) for m in version.lists if m not in lists)
    out |= _ManifestReader(io).reachable(lists.values(), live_only=False, missing_ok=True)
    return out
