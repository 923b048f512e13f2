"""A task's Parquet files, written by pyarrow where the task runs.

Each Arrow task (``tasks``) writes its rows here: one file per (task attempt, time chunk)
under ``<batch>/time_chunk=<chunk>/``, and its dead letters in one file, with row groups
of up to ``ROW_GROUP_ROWS`` and at most ``PENDING_BYTES`` buffered across its files. A
file's name carries the task's partition and attempt and a random tag, so attempts never
overwrite each other; the task reports each file it closed (``WrittenFile``), and the
driver keeps only reported files (``segments.finish``).

Files go through one layer, ``table.storage`` (pyarrow's filesystems): a local or shared
directory, or an object store (``s3://``). There a file is one PUT when its writer closes
(atomic: no temporary name, no rename). The tasks get the store's endpoint, region and
addressing in their plan (``ObjectStore.to_json()``, no credential in it: Spark shows a
job's closures to whoever reads its UI); their credentials come from the executors' own
AWS environment, profile or instance role.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

ROW_GROUP_ROWS = 131_072  # rows buffered per file before a row group is written
# Rows a task holds before writing, across all its files: a batch spread over hundreds of
# time chunks would otherwise keep each chunk's rows (under ROW_GROUP_ROWS) until the end.
PENDING_BYTES = 64 * 1024 * 1024
# Rows of a file's first row group that decide which columns get a dictionary.
DICTIONARY_SAMPLE_ROWS = 4096
DICTIONARY_MIN_ROWS = 64  # fewer rows than this cannot tell repeats from distinct values


@dataclass(frozen=True)
class WrittenFile:
    name: str  # relative to the task's root
    value: Any  # the partition column's value (the time chunk), None without one
    rows: int
    bytes: int


@lru_cache(maxsize=8)
def task_storage(path: str, store_json: str | None):
    """The storage of a write's ``path`` where a task runs (reused by a worker's tasks): the
    daemon's endpoint (``objectStore.executorEndpoint`` if set), region and addressing over
    this host's AWS environment, whose credentials it uses."""
    from reconciler.table import storage

    if not storage.is_object_store(path):
        return storage.at(path)
    public = json.loads(store_json) if store_json else {}
    return storage.Storage(path, storage.ObjectStore.from_environment(public))


class Files:
    """One Parquet file per partition value, row groups of up to ``ROW_GROUP_ROWS``."""

    def __init__(self, root: str | os.PathLike[str], stem: str, column: str | None,
                 pending_bytes: int = PENDING_BYTES, storage: Any = None):
        self.root, self.stem, self.column = str(root), stem, column
        self.storage = storage if storage is not None else task_storage(self.root, None)
        self.writers: dict[Any, Any] = {}
        self.pending: dict[Any, list] = {}
        self.pending_rows: dict[Any, int] = {}
        self.pending_size: dict[Any, int] = {}
        self.names: dict[Any, str] = {}
        self.rows: dict[Any, int] = {}
        self.limit = pending_bytes
        self.held = 0  # bytes buffered across all values
        # Decided once per task, from its first flush large enough to tell: counting each
        # file's columns again cost more than the dictionaries saved when a batch spans
        # hundreds of chunks (a few hundred rows per file; benchmarks/PROFILE.md).
        self.dictionary: list[str] | None = None

    def add_table(self, table: Any) -> None:
        """Route a table's rows to their files by the partition column (dropped from the rows)."""
        if not table.num_rows:
            return
        if not self.column:
            for batch in table.to_batches():
                self.add(None, batch)
            return
        import pyarrow as pa
        import pyarrow.compute as pc

        index = table.schema.get_field_index(self.column)
        column = table.column(index)
        rows = table.remove_column(index)
        column = column.combine_chunks()
        if pa.types.is_dictionary(column.type):  # its nulls would stay null codes: no run of their own
            column = column.cast(column.type.value_type)
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        values, codes = encoded.dictionary, encoded.indices
        if len(values) == 1:  # the usual case: a stream's records are close in time
            self._add_batches(values[0].as_py(), rows)
            return
        # One stable sort by chunk, then each run's rows: a filter per chunk read the whole
        # table once per chunk (a backfill over a month of minute chunks: 40,000 passes).
        # Each run is taken on its own, so what waits for its file holds its own buffers,
        # not a slice of a copy of the whole table (PENDING_BYTES bounds what is held).
        order = pc.sort_indices(codes)
        runs = pc.run_end_encode(codes.take(order))
        start = 0
        for end, code in zip(runs.run_ends.to_pylist(), runs.values.to_pylist(), strict=True):
            self._add_batches(values[code].as_py(), rows.take(order.slice(start, end - start)))
            start = end

    def _add_batches(self, value: Any, table: Any) -> None:
        for batch in table.to_batches():
            self.add(value, batch)

    def add(self, value: Any, batch: Any) -> None:
        if not batch.num_rows:
            return
        self.rows[value] = self.rows.get(value, 0) + batch.num_rows
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

    def close(self) -> list[WrittenFile]:
        """Write what is buffered and close every file: what was written, with sizes."""
        for value in list(self.pending):
            self._flush(value)
        for writer in self.writers.values():
            writer.close()
        out = []
        for value, name in self.names.items():
            location = self.storage.join(self.root, name)
            size = self.storage.fs.get_file_info(self.storage.path(location)).size
            out.append(WrittenFile(name, value, self.rows.get(value, 0), int(size or 0)))
        return sorted(out, key=lambda f: f.name)

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
