"""``df.write.format("reconciler_parquet")``: a batch's Parquet files, written by pyarrow.

Spark's own Parquet writer, on a local filesystem without Hadoop's native library,
forks ``chmod`` from the JVM for every file it creates (and sorts each task's rows by
partition first); a batch that spans many time chunks spent most of its time there
(benchmarks/PROFILE.md). This sink keeps Spark for reading and transforming and hands
each task's Arrow batches to pyarrow, which writes one file per (task, time chunk).
The sink also names most rows' chunks itself (``_Chunks``, from ``__time``), once per
distinct chunk instead of Spark formatting a string per row.

Exactly once does not depend on Spark's commit protocol: each task names its files
with its partition and attempt and returns them in its commit message, and the job's
``commit`` writes the list (``COMMITTED``) beside them. ``segments.write_batch`` keeps
only listed files; a failed or retried attempt's files are deleted there.

Files go through one layer, ``table.storage`` (pyarrow's filesystems): a local or shared
directory, or an object store (``s3://``). There a file is one PUT when its writer closes
(atomic: no temporary name, no rename) and the commit list is one PUT too. The executors
get the store's endpoint, region and addressing in the write's options (``objectStore``,
no credential in it: Spark shows options in its UI); their credentials come from their
own AWS environment, profile or instance role.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

NAME = "reconciler_parquet"
COMMITTED = "_committed.json"
ROW_GROUP_ROWS = 131_072  # rows buffered per file before a row group is written
# Rows a task holds before writing, across all its files: a batch spread over hundreds of
# time chunks would otherwise keep each chunk's rows (under ROW_GROUP_ROWS) until the end.
PENDING_BYTES = 64 * 1024 * 1024
# Rows of a file's first row group that decide which columns get a dictionary.
DICTIONARY_SAMPLE_ROWS = 4096
DICTIONARY_MIN_ROWS = 64  # fewer rows than this cannot tell repeats from distinct values


@dataclass
class SinkCommit(WriterCommitMessage):
    files: list[str] = field(default_factory=list)  # relative to the sink's path


def options(
    path: str | os.PathLike[str],
    partition_column: str | None = None,
    *,
    chunk_granularity: str | None = None,
    time_column: str | None = None,
) -> dict[str, str]:
    """Options for ``df.write.format(NAME).mode("append").options(**options(...)).save()``.

    With ``chunk_granularity`` (and ``time_column``), a row whose partition value is null
    goes to the chunk of its time at that granularity (``transform.good_rows`` with
    ``sink_chunks``) instead of ``__HIVE_DEFAULT_PARTITION__``."""
    from reconciler.table import storage

    out = {"path": str(path)}
    if storage.is_object_store(path):
        out["objectStore"] = storage.current().to_json()
    if partition_column:
        out["partitionColumn"] = partition_column
    if chunk_granularity:
        if not (partition_column and time_column):
            raise ValueError("chunk_granularity needs a partition column and a time column")
        out["chunkGranularity"] = chunk_granularity
        out["timeColumn"] = time_column
    return out


def committed_files(path: str | os.PathLike[str]) -> list[str] | None:
    """The files the job committed (relative paths), or None when no job committed here."""
    from reconciler.table import storage

    files = storage.at(path)
    try:
        return json.loads(files.read_bytes(files.join(str(path), COMMITTED)))["files"]
    except FileNotFoundError:
        return None


@lru_cache(maxsize=8)
def _storage(path: str, store_json: str | None):
    """The storage of a write's ``path`` in an executor's Python worker (reused by its tasks):
    the daemon's endpoint (``objectStore.executorEndpoint`` if set), region and addressing over
    this host's AWS environment, whose credentials it uses."""
    from reconciler.table import storage

    if not storage.is_object_store(path):
        return storage.at(path)
    public = json.loads(store_json) if store_json else {}
    return storage.Storage(path, storage.ObjectStore.from_environment(public))


class ParquetSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema: Any, overwrite: bool) -> _Writer:
        chunks = None
        if self.options.get("chunkGranularity"):
            chunks = _Chunks(self.options["timeColumn"], self.options["chunkGranularity"])
        return _Writer(self.options["path"], self.options.get("partitionColumn"), chunks,
                       self.options.get("objectStore"))


class _Chunks:
    """Names the time chunk of rows by their time: ``transform.chunk_column``'s twin for
    the years 1000 to 9999 (the rows ``good_rows(sink_chunks=True)`` leaves unnamed)."""

    def __init__(self, time_column: str, granularity: str):
        from reconciler.pipeline.transform import ARROW_FLOOR

        if granularity not in ARROW_FLOOR:
            raise ValueError(f"unknown segment granularity: {granularity!r}")
        self.time_column = time_column
        self.unit, self.multiple = ARROW_FLOOR[granularity]

    def route(self, rows: Any, files: _Files) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        times = rows.column(rows.schema.get_field_index(self.time_column))
        # The UTC wall clock: floor_temporal on a zoned type converts every value (7x slower).
        floored = pc.floor_temporal(times.cast(pa.timestamp("us")), multiple=self.multiple, unit=self.unit)
        if floored.null_count:
            files.add(None, rows.filter(pc.is_null(floored)))
        bounds = pc.min_max(floored)
        low, high = bounds["min"].value, bounds["max"].value
        if low is None:
            return
        if low == high:  # the usual case: a stream's records are close in time
            files.add(_chunk_name(bounds["min"].as_py()), rows.filter(pc.is_valid(floored)) if floored.null_count else rows)
            return
        for value in pc.unique(floored.drop_null()):
            files.add(_chunk_name(value.as_py()), rows.filter(pc.equal(floored, value)))


def _chunk_name(start: Any) -> str:
    from reconciler.pipeline.transform import CHUNK_FORMAT

    if not 1000 <= start.year <= 9999:  # Spark names these (good_rows); never routed here
        raise ValueError(f"time chunk {start} is outside the years the sink names")
    return start.strftime(CHUNK_FORMAT)


class _Writer(DataSourceArrowWriter):
    def __init__(self, path: str, partition_column: str | None, chunks: _Chunks | None = None,
                 store: str | None = None):
        self.path = path
        self.partition_column = partition_column
        self.chunks = chunks
        self.store = store  # ObjectStore.to_json(): no credentials

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        stem = f"part-{ctx.partitionId():05d}-{ctx.attemptNumber()}-{uuid.uuid4().hex[:12]}" if ctx else \
            f"part-{uuid.uuid4().hex}"
        files = _Files(self.path, stem, self.partition_column, storage=_storage(self.path, self.store))
        try:
            for batch in iterator:
                if batch.num_rows:
                    self._route(batch, files)
            return SinkCommit(files.close())
        except BaseException:
            files.abort()
            raise

    def _route(self, batch: Any, files: _Files) -> None:
        if not self.partition_column:
            files.add(None, batch)
            return
        import pyarrow.compute as pc

        index = batch.schema.get_field_index(self.partition_column)
        column = batch.column(index)
        rows = batch.remove_column(index)
        if self.chunks is not None and column.null_count:
            if column.null_count == len(column):
                self.chunks.route(rows, files)
                return
            unnamed = pc.is_null(column)
            self.chunks.route(rows.filter(unnamed), files)
            named = pc.invert(unnamed)
            rows, column = rows.filter(named), column.filter(named)
        values = pc.unique(column)
        if len(values) == 1:  # the usual case: a stream's records are close in time
            files.add(values[0].as_py(), rows)
            return
        for value in values:
            files.add(value.as_py(), rows.filter(pc.equal(column, value)))

    def _driver_storage(self):
        """The storage as the driver reaches it. The commit and the abort run beside the Spark
        driver: in a classic session that is the daemon's own process, which reaches the store
        at the daemon's endpoint (``executorEndpoint`` may resolve only on the executors); a
        Spark Connect server, not configured with the daemon's store, reaches it as executors do."""
        from reconciler.table import storage

        if storage.is_object_store(self.path) and storage.configured():
            return storage.at(self.path)
        return _storage(self.path, self.store)

    def commit(self, messages: list[SinkCommit | None]) -> None:
        names = sorted(f for m in messages if m is not None for f in m.files)
        files = self._driver_storage()
        # Whole or not at all: a PUT, or a rename on local disk (Storage.write_bytes).
        files.write_bytes(files.join(self.path, COMMITTED), json.dumps({"files": names}).encode())

    def abort(self, messages: list[SinkCommit | None]) -> None:
        files = self._driver_storage()
        files.delete(files.join(self.path, name) for m in messages for name in (m.files if m is not None else ()))


class _Files:
    """One Parquet file per partition value, row groups of up to ``ROW_GROUP_ROWS``."""

    def __init__(self, root: str | os.PathLike[str], stem: str, column: str | None,
                 pending_bytes: int = PENDING_BYTES, storage: Any = None):
        self.root, self.stem, self.column = str(root), stem, column
        self.storage = storage if storage is not None else _storage(self.root, None)
        self.writers: dict[Any, Any] = {}
        self.pending: dict[Any, list] = {}
        self.pending_rows: dict[Any, int] = {}
        self.pending_size: dict[Any, int] = {}
        self.names: dict[Any, str] = {}
        self.limit = pending_bytes
        self.held = 0  # bytes buffered across all values
        # Decided once per task, from its first flush large enough to tell: counting each
        # file's columns again cost more than the dictionaries saved when a batch spans
        # hundreds of chunks (a few hundred rows per file; benchmarks/PROFILE.md).
        self.dictionary: list[str] | None = None

    def add(self, value: Any, batch: Any) -> None:
        if not batch.num_rows:
            return
        self.pending.setdefault(value, []).append(batch)
        self.pending_rows[value] = self.pending_rows.get(value, 0) + batch.num_rows
        size = batch.nbytes
        self.pending_size[value] = self.pending_size.get(value, 0) + size
        self.held += size
        if self.pending_rows[value] >= ROW_GROUP_ROWS:
            self._flush(value)
        while self.held > self.limit and self.pending:  # a smaller row group, not more memory
            self._flush(max(self.pending_size, key=self.pending_size.__getitem__))

    def _flush(self, value: Any) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        batches = self.pending.pop(value, [])
        self.pending_rows.pop(value, None)
        self.held -= self.pending_size.pop(value, 0)
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        writer = self.writers.get(value)
        if writer is None:
            name = f"{self.stem}.parquet" if not self.column else f"{_dir_name(self.column, value)}/{self.stem}.parquet"
            target = self.storage.join(self.root, name)
            if not self.storage.remote:  # an object store has no directories to make
                os.makedirs(os.path.dirname(target), exist_ok=True)
            use_dictionary = self.dictionary
            if use_dictionary is None:
                use_dictionary = _dictionary_columns(table)
                if use_dictionary is not True:
                    self.dictionary = use_dictionary
            # On an object store the file is uploaded while it is written and is visible
            # only once the writer closes (a multipart upload's completion: atomic).
            writer = pq.ParquetWriter(self.storage.path(target), table.schema, filesystem=self.storage.fs,
                                      compression="snappy", use_dictionary=use_dictionary)
            self.writers[value], self.names[value] = writer, name
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)

    def close(self) -> list[str]:
        for value in list(self.pending):
            self._flush(value)
        for writer in self.writers.values():
            writer.close()
        return sorted(self.names.values())

    def abort(self) -> None:
        for writer in self.writers.values():
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the task is failing anyway; the files go next
                pass
        self.storage.delete(self.storage.join(self.root, name) for name in self.names.values())


def _dictionary_columns(table: Any) -> bool | list[str]:
    """The columns whose values repeat in the table's first rows (at most one distinct
    value in two): a dictionary pays off there. A column of distinct values (ids, offsets,
    times) gets none: pyarrow would hash every value into a dictionary page, give up on it
    when it outgrows its limit, and write a larger file for more CPU (benchmarks/PROFILE.md).
    A first flush too small to tell (one forced by the pending-bytes bound) keeps pyarrow's
    default, a dictionary for every column, as does a column Arrow cannot count (nested)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sample = table.slice(0, DICTIONARY_SAMPLE_ROWS)
    if sample.num_rows < DICTIONARY_MIN_ROWS:
        return True
    chosen = []
    for name, column in zip(sample.column_names, sample.columns, strict=True):
        try:
            distinct = pc.count_distinct(column, mode="all").as_py()
        except pa.ArrowNotImplementedError:
            distinct = 0
        if distinct <= sample.num_rows // 2:
            chosen.append(name)
    return chosen


NO_VALUE = "__HIVE_DEFAULT_PARTITION__"  # a null partition value's directory, as Spark names it


def _dir_name(column: str, value: Any) -> str:
    """``<column>=<value>``, as Spark's ``partitionBy`` names it."""
    text = NO_VALUE if value is None else str(value)
    if "/" in text or text in (".", ".."):
        raise ValueError(f"unsafe partition value {text!r}")
    return f"{column}={text}"
