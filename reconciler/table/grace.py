"""The reader's grace: how long a file a commit unreferenced stays, for readers still on it.

A reader that loaded the table at one version (a long Trino query, DuckDB's
``iceberg_scan('<metadata file>')``) reads that version's metadata file, manifest lists,
manifests and data files, for as long as it runs. Each publish drops the metadata file 10
versions back and, every few commits, the snapshots beyond ``snapshotsKept`` with the files
only they needed (a compaction's inputs among them): at one commit a second, a version
stopped being reachable about 10 s after it stopped being current. So what a commit
unreferences is deleted only ``readerGrace`` seconds after the commit (default 10 minutes):

* the files a publish, a compaction or an expiry superseded are retired (``Retired``): kept
  in memory with the time they are due, deleted by the same best-effort path after a later
  commit (the deletion still only ever follows a durable commit). A process that stops
  first leaves them to orphan clean-up;
* orphan clean-up treats as referenced everything a metadata file still on storage
  references while that version may still be read (``held_by_readers``). A version ``k``
  stopped being current when version ``k+1`` committed, and every metadata file of version
  ``k+2`` or later was written after that (it was staged on ``k+1``): the oldest such file's
  time bounds it from above, so a version is released only when that bound is more than the
  grace ago.

So a reader may hold a version for ``readerGrace`` after a newer one replaced it (and as
long as it likes while it is among the last 10 versions, or the current one).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from pyiceberg.serializers import FromInputFile

from reconciler.table.reach import _ManifestReader, _norm

DEFAULT_READER_GRACE = 600.0  # settings.readerGrace
_VERSION = re.compile(r"(?:^|/)(\d+)-[^/]*\.metadata\.json$")


class Retired:
    """Files no version needs any more, each deleted once its grace has passed."""

    def __init__(self, grace: float, delete: Callable[[Sequence[str]], None],
                 clock: Callable[[], float] = time.monotonic):
        self.grace = grace
        self._delete = delete
        self.clock = clock
        self._lock = threading.Lock()
        self._due: list[tuple[float, tuple[str, ...]]] = []

    def retire(self, files: Iterable[str], now: float | None = None) -> None:
        """``files`` were unreferenced by a commit that is durable: delete them after the grace
        (at once without one), and whatever retired earlier is due now."""
        now = self.clock() if now is None else now
        files = tuple(files)
        with self._lock:
            if files:
                self._due.append((now + max(self.grace, 0.0), files))
            due = [f for t, fs in self._due if t <= now for f in fs]
            self._due = [(t, fs) for t, fs in self._due if t > now]
        if due:
            self._delete(due)

    def pending(self) -> list[str]:
        with self._lock:
            return [f for _, fs in self._due for f in fs]


def version_of(metadata_location: str) -> int | None:
    m = _VERSION.search(metadata_location)
    return int(m.group(1)) if m else None


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
    held: list[str] = []
    for version, path, _ in versions:
        later = [mtime for v, _, mtime in versions if v >= version + 2]
        if not later or min(later) >= now - grace:
            held.append(path)
    out: set[str] = set()
    reader = _ManifestReader(io)
    for path in held:
        out.add(_norm(path))
        try:
            metadata = FromInputFile.table_metadata(io.new_input(path))
        except (OSError, ValueError):
            continue  # deleted meanwhile, or a staging's half-written file: nothing a reader holds
        out |= reader.reachable(metadata.snapshots, live_only=False, missing_ok=True)
    return out
