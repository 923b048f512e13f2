"""A batch's Parquet files described as Iceberg ``DataFile`` entries, for the append.

pyiceberg's ``add_files`` describes each file on its own: it converts the file's Arrow
schema to an Iceberg schema, checks it against the table's, and derives the statistics
plan and the column-to-field-id mapping again, all in Python, for every file. A batch
spread over 278 hourly chunks on 2 tasks has 556 files, and that took 0.8 s of its
publish (benchmarks/PROFILE.md). A batch's files come from one writer with one schema,
so here the schema check runs once per distinct file schema and the plan and mapping
once per batch; each file still has its footer read for its own statistics, exactly
as ``add_files`` records them.

The helpers used are pyiceberg's own (``pyiceberg.io.pyarrow``), so the entries are the
ones ``add_files`` would write; the version is pinned in pyproject.toml.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    _check_pyarrow_schema_compatible,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata


def describe(metadata: TableMetadata, paths: Sequence[str]) -> list[DataFile]:
    """One ``DataFile`` per Parquet file of ``paths`` (local or on an object store), against ``metadata``'s current
    schema and partition spec. Raises ``ValueError`` when a file's columns do not fit
    the table's schema (as ``add_files`` does)."""
    if len(paths) != len(set(paths)):
        raise ValueError("a batch names one of its files twice")
    schema = metadata.schema()
    spec = metadata.spec()
    stats_columns = compute_statistics_plan(schema, metadata.properties)
    column_ids = parquet_path_to_id_mapping(schema)
    checked: list = []  # Arrow schemas already found compatible (a batch has one or two)
    out = []
    for path in paths:
        footer, size = _footer(path)
        arrow_schema = footer.schema.to_arrow_schema()
        if not any(arrow_schema.equals(s) for s in checked):
            _check_pyarrow_schema_compatible(schema, arrow_schema, format_version=metadata.format_version)
            checked.append(arrow_schema)
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=footer, stats_columns=stats_columns, parquet_column_mapping=column_ids)
        out.append(DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=statistics.partition(spec, schema),
            file_size_in_bytes=size,
            sort_order_id=None,
            spec_id=metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **statistics.to_serialized_dict(),
        ))
    return out


def _footer(path: str):
    """A file's Parquet footer and size: from local disk, or from an object store (one
    ranged read of the object's tail, through ``storage``)."""
    from reconciler.table import storage

    if not storage.is_object_store(path):
        local = path.removeprefix("file://")
        return pq.read_metadata(local), os.path.getsize(local)
    files = storage.at(path)
    with files.fs.open_input_file(files.path(path)) as f:
        return pq.read_metadata(f), f.size()
