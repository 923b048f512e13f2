"""The file side of the commit protocol: stage, then promote after the publish.

Layout under ``segments_dir`` (``D`` is a datasource, ``B`` a batch id)::

    D/time_chunk=<chunk>/B-<n>.parquet        committed rows (Hive-style partitions)
    _deadletter/D/B-<n>.parquet              committed dead letters
    _staging/B/time_chunk=<chunk>/part-*.parquet   a batch being written (Spark output)
    _staging/B/_deadletter/part-*.parquet         its dead letters
    _staging/B/_manifest.json                     what promote() will move, and where

Only committed files live under ``D/``, so ``spark.read.parquet("<segments>/D")``,
``pyarrow.dataset.dataset(..., partitioning="hive")`` and DuckDB's
``read_parquet('<segments>/D/*/*.parquet', hive_partitioning=true)`` read exactly
the committed rows. A batch is published (database compare-and-swap) after
``write_batch`` returned, which wrote the manifest last (durably); promote() runs
after the publish, and a crash between the two is repaired at start-up by
``load_manifest`` + ``promote`` for batches the database says are committed, and
``discard`` for the others (``staging_batch_ids``).

The functions are small and path-based (``os.replace``, ``os.fsync``) so that a
``pyarrow.fs`` backend for object stores can stand in for them later.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from reconciler.pipeline.transform import SEGMENT, chunk_interval

STAGING = "_staging"
DEADLETTER = "_deadletter"
MANIFEST = "_manifest.json"
SEGMENT_PREFIX = f"{SEGMENT}="

_BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_DATASOURCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


@dataclass(frozen=True)
class StagedFile:
    """One Parquet file of a staged batch and where promote() puts it."""

    staging_path: str
    final_path: str
    segment: str | None  # chunk string, e.g. "20261120T1000Z"; None for dead letters
    interval_start: str | None  # ISO-8601 UTC, e.g. "2026-11-20T10:00:00Z"
    interval_end: str | None
    rows: int
    bytes: int


@dataclass(frozen=True)
class StagedBatch:
    """What one batch wrote to staging: the segment files and the dead-letter files."""

    batch_id: str
    datasource: str
    files: tuple[StagedFile, ...]
    rows: int
    dead_rows: int
    dead_files: tuple[StagedFile, ...] = ()
    segments_dir: str = ""
    segment_granularity: str = "hour"
    input_rows: int | None = None  # records read, when known (observed during the write)

    @property
    def staging_dir(self) -> str:
        return str(staging_dir(self.segments_dir, self.batch_id))

    @property
    def segments(self) -> tuple[str, ...]:
        """The distinct chunk strings this batch wrote, sorted."""
        return tuple(sorted({f.segment for f in self.files if f.segment}))

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_document(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["files"] = [asdict(f) for f in self.files]
        doc["dead_files"] = [asdict(f) for f in self.dead_files]
        return doc

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> StagedBatch:
        d = dict(doc)
        d["files"] = tuple(StagedFile(**f) for f in d.get("files", ()))
        d["dead_files"] = tuple(StagedFile(**f) for f in d.get("dead_files", ()))
        return cls(**d)


# --------------------------------------------------------------------------- paths


def check_batch_id(batch_id: str) -> str:
    # Spark, pyarrow and DuckDB skip files starting with "_" or "."; a batch id names files.
    if not _BATCH_ID.match(batch_id):
        raise ValueError(
            f"bad batch id {batch_id!r}: letters, digits, '.', '_' and '-', not starting with '.' or '_'"
        )
    return batch_id


def check_datasource(datasource: str) -> str:
    if not _DATASOURCE.match(datasource):
        raise ValueError(f"bad datasource name {datasource!r}")
    return datasource


def datasource_dir(segments_dir: str | os.PathLike[str], datasource: str) -> Path:
    return Path(segments_dir) / check_datasource(datasource)


def deadletter_dir(segments_dir: str | os.PathLike[str], datasource: str) -> Path:
    return Path(segments_dir) / DEADLETTER / check_datasource(datasource)


def staging_dir(segments_dir: str | os.PathLike[str], batch_id: str) -> Path:
    return Path(segments_dir) / STAGING / check_batch_id(batch_id)


def final_segment_path(
    segments_dir: str | os.PathLike[str], datasource: str, chunk: str, batch_id: str, n: int
) -> Path:
    return (
        datasource_dir(segments_dir, datasource)
        / f"{SEGMENT_PREFIX}{chunk}"
        / f"{batch_id}-{n:05d}.parquet"
    )


def _iso(dt: Any) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def _parquet_files(root: Path) -> list[Path]:
    """Data files Spark wrote under root (not .crc, _SUCCESS, or hidden files)."""
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.iterdir()
        if p.is_file() and p.suffix == ".parquet" and p.name[0] not in "._"
    )


# --------------------------------------------------------------------------- durability


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_all(files: Iterable[Path], dirs: Iterable[Path]) -> None:
    """fsync files, then directories, a few at a time (each waits on the disk, not the CPU)."""
    files, dirs = list(files), sorted(set(dirs))
    if len(files) + len(dirs) <= 4:
        for f in files:
            _fsync_file(f)
        for d in dirs:
            _fsync_dir(d)
        return
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="fsync") as pool:
        list(pool.map(_fsync_file, files))
        list(pool.map(_fsync_dir, dirs))


def _write_json_atomic(path: Path, doc: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


# --------------------------------------------------------------------------- write


def _collect_segment_files(
    segments_dir: Path, datasource: str, batch_id: str, granularity: str
) -> list[StagedFile]:
    stage = staging_dir(segments_dir, batch_id)
    out: list[StagedFile] = []
    n = 0
    chunk_dirs = (
        sorted(p for p in stage.iterdir() if p.is_dir() and p.name.startswith(SEGMENT_PREFIX))
        if stage.is_dir()
        else []
    )
    for chunk_dir in chunk_dirs:
        chunk = chunk_dir.name[len(SEGMENT_PREFIX) :]
        start, end = chunk_interval(chunk, granularity)
        for path in _parquet_files(chunk_dir):
            rows = pq.read_metadata(path).num_rows
            if rows == 0:
                path.unlink()
                continue
            final = final_segment_path(segments_dir, datasource, chunk, batch_id, n)
            n += 1
            out.append(
                StagedFile(
                    staging_path=str(path),
                    final_path=str(final),
                    segment=chunk,
                    interval_start=_iso(start),
                    interval_end=_iso(end),
                    rows=rows,
                    bytes=path.stat().st_size,
                )
            )
    return out


def _collect_dead_files(segments_dir: Path, datasource: str, batch_id: str) -> list[StagedFile]:
    root = staging_dir(segments_dir, batch_id) / DEADLETTER
    out: list[StagedFile] = []
    n = 0
    for path in _parquet_files(root):
        rows = pq.read_metadata(path).num_rows
        if rows == 0:
            path.unlink()
            continue
        final = deadletter_dir(segments_dir, datasource) / f"{batch_id}-{n:05d}.parquet"
        n += 1
        out.append(StagedFile(str(path), str(final), None, None, None, rows, path.stat().st_size))
    return out


def write_batch(
    spark: SparkSession,
    df: DataFrame,
    dead_df: DataFrame | None,
    segments_dir: str | os.PathLike[str],
    datasource: str,
    batch_id: str,
    *,
    segment_granularity: str = "hour",
    dead_count: Callable[[], int | None] | None = None,
    input_rows: Callable[[], int | None] | None = None,
    fsync: bool = True,
) -> StagedBatch:
    """Write a batch's rows and dead letters to staging; return what promote() will move.

    ``df`` must have a ``time_chunk`` column (see ``transform``). ``dead_count``, when
    given, is asked after the segment write (e.g. an ``Observation`` filled during it):
    if it answers 0 the dead-letter write, a second Spark job over the same input, is
    skipped. Nothing becomes visible under ``<segments_dir>/<datasource>/`` here.
    """
    # Parquet timestamps as INT64 micros, UTC-adjusted (not INT96), whoever built the session.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    check_datasource(datasource)
    root = Path(segments_dir).absolute()
    stage = staging_dir(root, batch_id)
    if SEGMENT not in df.columns:
        raise ValueError(f"the frame has no {SEGMENT} column: {df.columns}")

    stage.parent.mkdir(parents=True, exist_ok=True)
    # One Spark job: read, parse, (roll up), write one file per (task, chunk).
    df.write.mode("overwrite").partitionBy(SEGMENT).parquet(str(stage))
    known_dead = dead_count() if dead_count is not None else None
    if dead_df is not None and known_dead != 0:
        dead_df.write.mode("overwrite").parquet(str(stage / DEADLETTER))

    files = _collect_segment_files(root, datasource, batch_id, segment_granularity)
    dead_files = _collect_dead_files(root, datasource, batch_id)
    if fsync:
        # Files, their directories, and the directories up to segments_dir: after a
        # power loss the staged batch must still be there once the database says it
        # is committed (the manifest, written last, is synced the same way).
        paths = [Path(f.staging_path) for f in (*files, *dead_files)]
        _fsync_all(paths, [*(p.parent for p in paths), stage, stage.parent, root])
    staged = StagedBatch(
        batch_id=batch_id,
        datasource=datasource,
        files=tuple(files),
        rows=sum(f.rows for f in files),
        dead_rows=sum(f.rows for f in dead_files),
        dead_files=tuple(dead_files),
        segments_dir=str(root),
        segment_granularity=segment_granularity,
        input_rows=input_rows() if input_rows is not None else None,
    )
    write_manifest(staged)
    return staged


# --------------------------------------------------------------------------- manifest


def write_manifest(staged: StagedBatch) -> Path:
    """Write ``_manifest.json`` into the batch's staging dir (atomically, durably)."""
    path = Path(staged.staging_dir) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json_atomic(path, staged.to_document())
    return path


def load_manifest(segments_dir: str | os.PathLike[str], batch_id: str) -> StagedBatch | None:
    """The staged batch's manifest, or None when there is none (never staged, or promoted)."""
    path = staging_dir(segments_dir, batch_id) / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return StagedBatch.from_document(doc)


# --------------------------------------------------------------------------- promote / discard


def promote(staged: StagedBatch) -> None:
    """Move a published batch's files to their final paths, then drop its staging dir.

    Idempotent: a file already moved (staging gone, final present) is skipped, so a
    crashed promote can simply be run again. A file missing in both places is an
    error (raised before the staging dir, and so the manifest, is removed).
    """
    moved_dirs: set[Path] = set()
    made_dirs: set[Path] = set()
    for f in (*staged.files, *staged.dead_files):
        src, dst = Path(f.staging_path), Path(f.final_path)
        if src.exists():
            if dst.parent not in made_dirs:
                dst.parent.mkdir(parents=True, exist_ok=True)
                made_dirs.add(dst.parent)
            os.replace(src, dst)
            moved_dirs.add(dst.parent)
        elif not dst.exists():
            raise FileNotFoundError(
                f"batch {staged.batch_id}: {f.staging_path} is gone and {f.final_path} does not exist"
            )
    # The renames (and new chunk directories) are durable before the manifest goes.
    parents = {d.parent for d in moved_dirs}
    _fsync_all([], moved_dirs | parents | {p.parent for p in parents})
    _remove_tree(Path(staged.staging_dir))


def discard(segments_dir: str | os.PathLike[str], batch_id: str) -> None:
    """Delete a batch's staging dir (an unpublished or fenced batch); no-op if absent."""
    _remove_tree(staging_dir(segments_dir, batch_id))


def staging_batch_ids(segments_dir: str | os.PathLike[str]) -> list[str]:
    """Batch ids that have a staging dir (for start-up recovery), sorted.

    Also removes leftovers of a deletion that a crash interrupted (``.B.deleting``).
    """
    root = Path(segments_dir) / STAGING
    if not root.is_dir():
        return []
    ids = []
    for p in root.iterdir():
        if not p.is_dir():
            continue
        if p.name.startswith(".") and p.name.endswith(".deleting"):
            shutil.rmtree(p, ignore_errors=True)
        elif _BATCH_ID.match(p.name):
            ids.append(p.name)
    return sorted(ids)


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    # Rename first so a crash half-way leaves no half-deleted dir under its batch id.
    trash = path.with_name(f".{path.name}.deleting")
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    _fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def committed_files(segments_dir: str | os.PathLike[str], datasource: str) -> list[Path]:
    """Every committed segment file of a datasource (for tools and tests)."""
    root = datasource_dir(segments_dir, datasource)
    if not root.is_dir():
        return []
    return sorted(
        p
        for d in root.iterdir()
        if d.is_dir() and d.name.startswith(SEGMENT_PREFIX)
        for p in _parquet_files(d)
    )


def iter_staged_paths(staged: StagedBatch) -> Iterable[str]:
    for f in (*staged.files, *staged.dead_files):
        yield f.staging_path
