"""Making files durable before the database points at them.

A commit moves a table's metadata pointer in the database; after a power cut the
database is what it committed (SQLite ``synchronous=FULL``, PostgreSQL's WAL), so every
file the new pointer reaches must already be on stable storage: the data files, the
metadata JSON, the manifest list, the manifests, and the directory entries of each
(a file fsynced in a directory whose entry was not is lost all the same). Everything a
commit will reference goes through ``sync`` before the commit's transaction starts.

On object storage (``s3://``) a PUT that returned is durable and there are no
directories: ``sync`` has nothing to do there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FSYNC_THREADS = 8

# One pool per process, kept: a pool made per call started up to eight threads for every
# batch's files and again for its commit's metadata, and each start waits for the new
# thread to run, on a loaded machine a scheduler's turn (12% of a small batch's step in a
# profile at taskDuration 0.25s). Made again in a forked child, whose copy has no threads.
_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=FSYNC_THREADS, thread_name_prefix="fsync"))
        return _pool[1]


def _fsync(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    _fsync(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def sync(files: Iterable[str | os.PathLike[str]], dirs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """fsync ``files``, then the directories that hold them and ``dirs``.

    Many files (a batch over hundreds of time chunks) are fsynced a few at a time
    (``os.fsync`` releases the GIL), so the filesystem's journal commits them together.
    Directories go after the files they hold."""
    paths = [Path(f) for f in files]
    folders = {p.parent for p in paths} | {Path(d) for d in dirs}
    if not paths and not folders:
        return
    pool = _executor()
    list(pool.map(_fsync, paths))
    list(pool.map(_fsync_dir, sorted(d for d in folders if d.is_dir())))


def ancestors(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> list[Path]:
    """The directories from ``path``'s parent up to ``root`` (inclusive): each holds the
    entry of the one below, so each must be fsynced once the one below is new."""
    path, root = Path(path), Path(root)
    out = []
    d = path.parent
    while True:
        out.append(d)
        if d == root or d == d.parent:
            return out
        d = d.parent


def sync_tree(root: str | os.PathLike[str], up_to: str | os.PathLike[str] | None = None) -> list[Path]:
    """fsync every file and directory under ``root``, and the directories from ``root`` up to
    ``up_to`` (exclusive of nothing: each one's entry for the next). Returns the files."""
    root = Path(root)
    files: list[Path] = []
    dirs: list[Path] = []
    for dirpath, _dirnames, filenames in os.walk(root):
        dirs.append(Path(dirpath))
        files += [Path(dirpath) / f for f in filenames]
    if up_to is not None:
        stop = Path(up_to)
        d = root.parent
        while d != stop and stop in d.parents:
            dirs.append(d)
            d = d.parent
        dirs.append(stop)
    sync(files, dirs)
    return files
