"""Writing one batch's data files where its table will reference them.

A batch's rows go to ``<table>/data/batch=<B>/time_chunk=<chunk>/part-*.parquet``
and its dead letters to ``<table>_deadletter/data/batch=<B>/part-*.parquet``. Nothing
there is visible: a reader sees only the files a committed snapshot references, and
the publish (``reconciler.table``) commits them in one transaction with the
checkpoints. A batch that lost its publish is ``discard``ed; one a crash interrupted
is removed by the next leader's recovery (``batch_dirs`` + the database's batch ids).

One file per (task, time chunk): each file lies within one partition of the
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from reconciler.model import SEGMENT
from reconciler.pipeline import tasks
from reconciler.table import durable, storage
from reconciler.table.writeids import BATCH_DIR_PREFIX as BATCH_PREFIX

SEGMENT_PREFIX = f"{SEGMENT}="

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
    # Records the readers delivered per partition: the snapshot's ``reconciler.read``, with
    # which ``verify --deep`` tells a record missing from an offset that never held one.
    read_counts: Mapping[str, int] | None = None

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


def _check_visible(root: str, described: set[str], found: Iterable[str]) -> None:
    """Called after the Spark job succeeded: every file its tasks described must be visible
    here. When one is not (yet): the executors wrote through another endpoint of a store
    that replicates between sites, a gateway's cache, a shared directory's attribute cache;
    the batch fails and is read again. Nothing is deleted here; the failed batch is fenced,
    then deleted (``supervisor._abandon``)."""
    from reconciler.errors import RetryableError

    missing = sorted(described - set(found))
    if missing:
        raise RetryableError(f"{len(missing)} file(s) the Spark tasks wrote under {root} are not visible "
                             f"here yet (first: {missing[0]}); the batch is read again")


def _keep(root: str, described: dict[str, tasks.FileDescription], chunked: bool) -> list[DataFile]:
    """The described files under ``root`` as ``DataFile``s; anything else there (a killed task
    attempt's files) is deleted, so never left behind."""
    files = storage.at(root)
    found = files.list(root)
    wanted = {files.join(root, name): d for name, d in described.items()}
    _check_visible(root, set(wanted), found)
    files.delete(location for location in found if location not in wanted)
    return [DataFile(location, d.chunk if chunked else None, d.rows, d.bytes)
            for location, d in sorted(wanted.items()) if d.rows > 0]


def finish(
    results: tasks.TaskResults,
    data_dir: str | os.PathLike[str],
    dead_dir: str | os.PathLike[str],
    batch_id: str,
    *,
    fsync: bool = True,
) -> WrittenBatch:
    """The batch its tasks wrote (``tasks.run``), durable and uncommitted."""
    remote = storage.is_object_store(data_dir)
    if not remote:
        data_dir, dead_dir = Path(data_dir).absolute(), Path(dead_dir).absolute()
    by_kind: dict[str, dict[str, tasks.FileDescription]] = {tasks.DATA: {}, tasks.DEAD: {}}
    for d in results.files:
        by_kind[d.kind][d.path] = d
    files = _keep(str(data_dir), by_kind[tasks.DATA], chunked=True)
    dead_files = _keep(str(dead_dir), by_kind[tasks.DEAD], chunked=False)
    if fsync and not remote:  # on an object store a PUT that returned is durable
        # After a power loss the files must still be there once the database says committed.
        paths = [Path(f.path) for f in (*files, *dead_files)]
        # Up to the table's own directory, whose entry for data/ a new table has not made durable.
        dirs = {p.parent for p in paths} | {data_dir, dead_dir, data_dir.parent, dead_dir.parent,
                                            data_dir.parent.parent, dead_dir.parent.parent}
        durable.sync(paths, dirs)
    return WrittenBatch(batch_id, tuple(files), tuple(dead_files), results.records, results.input_bytes,
                        dict(results.read_counts))


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
