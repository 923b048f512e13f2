"""Which files of the spec directory are unchanged since the last pass, so they are not parsed again.

The daemon holds one ``FileCache`` across its passes and hands it to
``loader.load_directory``: with a thousand specs, parsing and validating every file on
every tick costs seconds, while asking the kernel whether a file changed costs
microseconds. A file is unchanged when its ``FileKey`` (device, inode, mode, size,
mtime and ctime in nanoseconds, and a symlink's target) is the one it had when it was
loaded. ctime is part of the key because tools that copy timestamps (``cp -p``,
``rsync -t``, ``tar``) can give new bytes the old mtime, but never the old ctime.

Timestamps have a granularity (a clock tick on Linux filesystems, a second or two on
some others), so a file written again within the same tick as the read keeps its key.
A file whose timestamps were that close to the moment it was read is "in doubt": on
the next lookup its bytes are read and compared by SHA-256, and only a file that was
confirmed long enough after its last change is trusted by its key alone.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

T = TypeVar("T")

# Coarser than any local filesystem's timestamps (FAT's 2 s included) and than the
# clock-tick granularity of Linux's ext4/xfs/btrfs/tmpfs.
GRANULARITY_NS = 2_000_000_000


@dataclass(frozen=True)
class FileKey:
    """What identifies one version of a file without reading it."""

    dev: int
    ino: int
    mode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    target: str | None = None  # where a symlink resolves to: repointing it is a change

    @classmethod
    def of(cls, st: os.stat_result, target: str | None = None) -> FileKey:
        return cls(st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, target)

    def settled(self, read_at_ns: int) -> bool:
        """True when the file's last change was well before ``read_at_ns`` (a wall-clock time)."""
        return read_at_ns - max(self.mtime_ns, self.ctime_ns) > GRANULARITY_NS


@dataclass(frozen=True)
class _Entry(Generic[T]):
    key: FileKey
    digest: str
    settled: bool
    value: T


@dataclass
class CacheStats:
    """Counters of the last ``begin()``-to-now pass, for logs, tests and the benchmark."""

    hits: int = 0
    confirmed: int = 0  # hits that needed the bytes read and hashed (in doubt)
    misses: int = 0


class FileCache(Generic[T]):
    """Loaded values by path, each valid while its file keeps the ``FileKey`` it was loaded with."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry[T]] = {}
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def begin(self) -> None:
        """Start counting a new pass."""
        self.stats = CacheStats()

    def lookup(self, path: str, key: FileKey, read: Callable[[], bytes | None]) -> T | None:
        """The value loaded from ``path`` if the file is unchanged, else None.

        ``read`` is called only for a file in doubt; it returns the file's bytes, or None
        when they cannot be read (then the file is loaded again, reporting why).
        """
        entry = self._entries.get(path)
        if entry is None or entry.key != key:
            self.stats.misses += 1
            return None
        if entry.settled:
            self.stats.hits += 1
            return entry.value
        read_at = time.time_ns()
        data = read()
        if data is None or digest(data) != entry.digest:
            self.stats.misses += 1
            return None
        self._entries[path] = replace(entry, settled=key.settled(read_at))
        self.stats.confirmed += 1
        return entry.value

    def store(self, path: str, key: FileKey, data: bytes, read_at_ns: int, value: T) -> None:
        """Remember ``value`` as loaded from ``data``, the bytes read at ``read_at_ns``."""
        self._entries[path] = _Entry(key, digest(data), key.settled(read_at_ns), value)

    def retain(self, paths: Iterable[str]) -> None:
        """Forget every path not in ``paths`` (files that were removed or renamed)."""
        keep = set(paths)
        for gone in [p for p in self._entries if p not in keep]:
            del self._entries[gone]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
