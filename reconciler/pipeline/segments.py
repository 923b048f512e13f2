"""Writing one batch's data files where its table will reference them.

A batch's rows go to ``<table>/data/batch=<B>/time_chunk=<chunk>/part-*.parquet``
and its dead letters to ``<table>_deadletter/data/batch=<B>/part-*.parquet``. Nothing
there is visible: a reader sees only the files a committed snapshot references, and
the publish (``reconciler.table``) commits them in one transaction with the
checkpoints. A batch that lost its publish is ``discard``ed; one a crash interrupted
is removed by the next leader's recovery (``batch_dirs`` + the database's batch ids).

One file per (Spark task, time chunk): each file lies within one partition of the
table (``__time`` by the segment granularity), which is what Iceberg's ``add_files``
needs to infer its partition.

The warehouse may be an object store (``s3://``, through ``table.storage``): there a file
is durable once its PUT returned (no fsync), a batch "directory" is a prefix (listed by
it, deleted object by object: a crash half-way leaves a fenced write's remainder, which
recovery deletes by the same prefix), and nothing is renamed.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from reconciler.errors import SparkMisconfigured
from reconciler.pipeline import sink
from reconciler.pipeline.transform import SEGMENT, TIME
from reconciler.table import storage
from reconciler.table.catalog import BATCH_DIR_PREFIX as BATCH_PREFIX

SEGMENT_PREFIX = f"{SEGMENT}="
FSYNC_THREADS = 8

_BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_DATASOURCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


@dataclass(frozen=True)
class DataFile:
    """One Parquet file a batch wrote."""

    path: str
    segment: str | None  # time chunk, e.g. "20261120T1000Z"; None for dead letters
    rows: int
    bytes: int


@dataclass(frozen=True)
class WrittenBatch:
    """What one batch wrote: data files and dead-letter files, not yet committed."""

    batch_id: str
    files: tuple[DataFile, ...]
    dead_files: tuple[DataFile, ...]
    input_rows: int | None = None  # records read, when observed during the write
    input_bytes: int | None = None  # their keys' and values' bytes, likewise

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def dead_rows(self) -> int:
        return sum(f.rows for f in self.dead_files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in (*self.files, *self.dead_files))


def check_batch_id(batch_id: str) -> str:
    if not _BATCH_ID.match(batch_id):
        raise ValueError(f"invalid batch id {batch_id!r}: letters, digits, '.', '_', '-' only")
    return batch_id


def check_datasource(datasource: str) -> str:
    if not _DATASOURCE.match(datasource):
        raise ValueError(f"invalid datasource {datasource!r}: letters, digits, '_', '-' only")
    return datasource


def _fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_all(files: Iterable[Path], dirs: Iterable[Path]) -> None:
    """Make files and directory entries durable (before the database says committed).

    A batch spread over many time chunks has hundreds of files; their fsyncs run a few at
    a time (``os.fsync`` releases the GIL), so the filesystem's journal commits them
    together instead of once per file. The directories go after the files they hold."""
    files = list(files)
    with ThreadPoolExecutor(max_workers=FSYNC_THREADS, thread_name_prefix="fsync") as pool:
        list(pool.map(_fsync_path, files))
        dirs = [d for d in dirs if d.is_dir()]
        list(pool.map(lambda d: _fsync_path(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)), dirs))


def _check_visible(root: str, listed: list[str] | None, found, keep) -> None:
    """Called after the Spark write succeeded, so its job committed: the commit list and
    every file it names must be visible here. When they are not (yet): the executors wrote
    through another endpoint of a store that replicates between sites, a gateway's cache, a
    shared directory's attribute cache), the batch fails and is read again. Never "no list,
    so no task committed": that deleted every file and published the batch without them,
    and the checkpoint moved past records no table holds. Nothing is deleted here; the
    failed batch is fenced, then deleted (``supervisor._abandon``)."""
    from reconciler.errors import RetryableError

    if listed is None:
        if found:  # files, but no commit list: it is on its way
            raise RetryableError(f"the Spark job wrote {len(found)} file(s) under {root} but its commit list "
                                 f"({sink.COMMITTED}) is not visible here yet; the batch is read again")
        return  # the job wrote nothing here (a dead-letter write skipped)
    present = set(found)
    missing = sorted(str(k) for k in keep if k not in present)
    if missing:
        raise RetryableError(f"{len(missing)} file(s) the Spark job committed under {root} are not visible "
                             f"here yet (first: {missing[0]}); the batch is read again")


def _collect_remote(root: str, chunked: bool) -> list[DataFile]:
    """``_collect`` on an object store: one listing by the batch's prefix."""
    files = storage.at(root)
    listed = sink.committed_files(root)
    found = files.list(root)
    keep = {files.join(root, name) for name in listed} if listed is not None else set()
    _check_visible(root, listed, found, keep)
    out: list[DataFile] = []
    doomed = []
    for location, (_mtime, size) in sorted(found.items()):
        if location not in keep:
            doomed.append(location)
            continue
        meta = pq.read_metadata(files.path(location), filesystem=files.fs)
        if meta.num_rows == 0:
            doomed.append(location)
            continue
        parent = location.rsplit("/", 2)[-2]
        segment = parent[len(SEGMENT_PREFIX):] if chunked and parent.startswith(SEGMENT_PREFIX) else None
        out.append(DataFile(location, segment, meta.num_rows, size))
    files.delete(doomed)
    return out


def _collect(root: Path | str, chunked: bool) -> list[DataFile]:
    """The Parquet files the job committed under ``root``; anything else (a failed task
    attempt's files, the commit list, empty files) is deleted, so never left behind."""
    if storage.is_object_store(root):
        return _collect_remote(str(root), chunked)
    out: list[DataFile] = []
    if not root.is_dir():
        return out
    listed = sink.committed_files(root)
    keep = {root / name for name in listed} if listed is not None else set()
    found = [p for p in sorted(root.rglob("*")) if not p.is_dir()]
    _check_visible(str(root), listed, found, keep)
    for path in found:
        if path not in keep:
            path.unlink()
            continue
        meta = pq.read_metadata(path)
        if meta.num_rows == 0:
            path.unlink()
            continue
        segment = None
        if chunked:
            part = path.parent.name
            segment = part[len(SEGMENT_PREFIX):] if part.startswith(SEGMENT_PREFIX) else None
        out.append(DataFile(str(path), segment, meta.num_rows, path.stat().st_size))
    return out


def write_batch(
    spark: SparkSession,
    df: DataFrame,
    dead_df: DataFrame | Callable[[], DataFrame] | None,
    data_dir: str | os.PathLike[str],
    dead_dir: str | os.PathLike[str],
    batch_id: str,
    *,
    dead_count: Callable[[], int | None] | None = None,
    input_rows: Callable[[], int | None] | None = None,
    input_bytes: Callable[[], int | None] | None = None,
    segment_granularity: str | None = None,
    fsync: bool = True,
) -> WrittenBatch:
    """Write a batch's rows under ``data_dir`` and its dead letters under ``dead_dir``.

    ``df`` must have a ``time_chunk`` column (see ``transform``): one file per (task,
    chunk). ``dead_count``, when given, is asked after the row write (an ``Observation``
    filled during it): if it answers 0 the dead-letter write, a second Spark job over
    the same input, is skipped. ``dead_df`` may be a function that builds the frame:
    Spark analyses a frame as it is built (about 0.1 s of py4j calls for a parse), so a
    batch without dead letters then never builds it. With ``segment_granularity`` the
    writers name the chunk of a row whose ``time_chunk`` is null from its ``__time``
    (``transform.good_rows(..., sink_chunks=True)``).
    """
    check_batch_id(batch_id)
    remote = storage.is_object_store(data_dir)
    if not remote:
        data_dir, dead_dir = Path(data_dir).absolute(), Path(dead_dir).absolute()
    if SEGMENT not in df.columns:
        raise ValueError(f"the frame has no {SEGMENT} column: {df.columns}")
    _activate(spark)
    row_options = sink.options(data_dir, SEGMENT, chunk_granularity=segment_granularity,
                               time_column=TIME if segment_granularity else None)
    df.write.format(sink.NAME).mode("append").options(**row_options).save()
    known_dead = dead_count() if dead_count is not None else None
    if dead_df is not None and known_dead != 0:
        if callable(dead_df):
            dead_df = dead_df()
        dead_df.write.format(sink.NAME).mode("append").options(**sink.options(dead_dir)).save()
    files = _collect(data_dir, chunked=True)
    if segment_granularity and any(f.segment == sink.NO_VALUE for f in files):
        # Only a sink that ignores the chunk options leaves good rows (which all have a
        # time) unnamed: workers running an older release than this daemon.
        raise SparkMisconfigured(
            "the Spark workers wrote rows without a time chunk: they run an older "
            "stream-reconciler than this daemon; install the same version where the "
            "workers run (and rebuild spark.archives), then the batch is read again")
    dead_files = _collect(dead_dir, chunked=False)
    if fsync and not remote:  # on an object store a PUT that returned is durable
        # After a power loss the files must still be there once the database says committed.
        paths = [Path(f.path) for f in (*files, *dead_files)]
        # Up to the table's own directory, whose entry for data/ a new table has not made durable.
        dirs = {p.parent for p in paths} | {data_dir, dead_dir, data_dir.parent, dead_dir.parent,
                                            data_dir.parent.parent, dead_dir.parent.parent}
        fsync_all(paths, dirs)
    return WrittenBatch(batch_id, tuple(files), tuple(dead_files),
                        input_rows() if input_rows is not None else None,
                        input_bytes() if input_bytes is not None else None)


def _activate(spark: SparkSession) -> None:
    """Make ``spark`` the active session of this thread's JVM twin.

    A write looks Python data sources up in the JVM thread's active session, and each
    Python thread talks to its own JVM thread, where none is set (reads look them up in
    the frame's session): without this a runtime thread's first write fails with
    DATA_SOURCE_NOT_FOUND. Spark Connect sets it per request on the server."""
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is not None:
        spark._jvm.SparkSession.setActiveSession(jsession)


def discard(*dirs: str | os.PathLike[str]) -> None:
    """Delete batch directories (an unpublished or fenced batch); absent ones are fine."""
    for d in dirs:
        if storage.is_object_store(d):  # a prefix: every object under it, one by one
            storage.at(d).delete_dir(str(d))
            continue
        path = Path(d)
        if not path.exists():
            continue
        # Rename first so a crash half-way leaves no half-deleted batch under its id.
        trash = path.with_name(f".{path.name}.deleting")
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def batch_dirs(table_dir: str | os.PathLike[str]) -> dict[str, Path | str]:
    """Batch id -> its directory under ``<table>/data`` (for recovery); also removes the
    leftovers of a deletion a crash interrupted."""
    if storage.is_object_store(table_dir):
        files = storage.at(table_dir)
        found = {}
        for d in files.dirs(files.join(str(table_dir), "data")):
            name = d.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(BATCH_PREFIX) and _BATCH_ID.match(name[len(BATCH_PREFIX):]):
                found[name[len(BATCH_PREFIX):]] = d
        return found
    root = Path(table_dir) / "data"
    if not root.is_dir():
        return {}
    out: dict[str, Path] = {}
    for p in root.iterdir():
        if not p.is_dir():
            continue
        if p.name.startswith(".") and p.name.endswith(".deleting"):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(BATCH_PREFIX) and _BATCH_ID.match(p.name[len(BATCH_PREFIX):]):
            out[p.name[len(BATCH_PREFIX):]] = p
    return out
