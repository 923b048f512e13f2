"""One batch: its offset ranges as Arrow tasks (``tasks``), then its files, durable.

No database here: the caller publishes the returned ``WrittenBatch`` (one table
commit with the checkpoints' compare-and-swap), or ``segments.discard``s it when the
publish lost.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import pyarrow as pa

from reconciler.model import DataSchema, PartitionRange, SupervisorSpec, source_to_document
from reconciler.pipeline import segments as seg
from reconciler.pipeline import tasks
from reconciler.pipeline.discovered import settle
from reconciler.pipeline.sources import DEFAULT_MAX_BATCH_ROWS, split_ranges
from reconciler.pipeline.transform import output_schemas as _output_schemas


def output_schemas(spark: Any, data_schema: DataSchema) -> tuple[pa.Schema, pa.Schema]:
    """The Arrow schemas of a datasource's rows (without ``time_chunk``) and of its dead
    letters (``spark`` unused: the transform is the tasks' own, no engine decides them)."""
    return _output_schemas(data_schema)


def run_batch(
    spark: Any,
    spec: SupervisorSpec,
    ranges: Sequence[PartitionRange],
    batch_id: str,
    *,
    data_dir: str | os.PathLike[str],
    dead_dir: str | os.PathLike[str],
    task_count: int | None = None,
    max_batch_rows: int | None = None,
    spec_dir: str | None = None,
    table_schema: pa.Schema | None = None,
) -> seg.WrittenBatch:
    """Read ``ranges`` of ``spec.source``, transform, and write the data files: one Arrow
    task per group of sub-ranges (``split_ranges`` into ``task_count`` groups). A schema
    file the format names is read under ``spec_dir`` (the spec's directory)."""
    seg.check_batch_id(batch_id)
    plan = task_plan(spec, ranges, data_dir, dead_dir, task_count, max_batch_rows, spec_dir, table_schema)
    if not plan.groups:
        return seg.WrittenBatch(batch_id, (), (), input_rows=0, input_bytes=0)
    results = tasks.run(spark, plan)
    if results.discovered and (again := settle(results.discovered)[1]):
        # A task wrote a new column in a type the batch's other values do not fit: run
        # it again with the joined types as the table's, so every task decides the same
        # whatever the cut (``discovered``); the first run's files were never described.
        seg.discard(data_dir, dead_dir)
        plan = replace(plan, table_types={**plan.table_types, **again})
        results = tasks.run(spark, plan)
    written = seg.finish(results, data_dir, dead_dir, batch_id)
    if not results.discovered:
        return written
    schema = discovered_schema(_output_schemas(spec.data_schema)[0], results.discovered)
    return DiscoveredBatch(**{f.name: getattr(written, f.name) for f in fields(written)}, schema=schema)


@dataclass(frozen=True)
class DiscoveredBatch(seg.WrittenBatch):
    """A batch of a spec with ``schemaDiscovery``: ``schema`` is what its rows hold (the
    declared columns and the discovered ones), which the publish evolves the table to."""

    schema: pa.Schema | None = None


def discovered_schema(declared: pa.Schema, found: Sequence[pa.Schema]) -> pa.Schema:
    """The declared columns, then each task's discovered ones in first-seen order, each in
    the type ``discovered.settle`` joins the tasks' to (a task's files read as it: Iceberg
    promotes int -> long; ``run_batch`` ran the batch again when they would not)."""
    final, _ = settle(found)
    out = {f.name: f for f in declared}
    for name, t in final.items():
        have = out.get(name)
        out[name] = pa.field(name, t) if have is None else pa.field(name, t, have.nullable)
    return pa.schema(list(out.values()))


def task_plan(
    spec: SupervisorSpec,
    ranges: Sequence[PartitionRange],
    data_dir: str | os.PathLike[str],
    dead_dir: str | os.PathLike[str],
    task_count: int | None = None,
    max_batch_rows: int | None = None,
    spec_dir: str | None = None,
    table_schema: pa.Schema | None = None,
) -> tasks.TaskPlan:
    """What the batch's tasks get: its sub-ranges in ``task_count`` groups, the source with
    secret references only, and an object store's public settings (never credentials)."""
    from reconciler.pipeline.formats import schema_files
    from reconciler.table import storage

    groups = split_ranges([r for r in ranges if r.size > 0], max(1, int(task_count or spec.task_count or 1)))
    remote = storage.is_object_store(data_dir)
    return tasks.TaskPlan(
        source=source_to_document(spec.source),
        data_schema=spec.data_schema,
        groups=tuple(tuple(g) for g in groups),
        data_dir=str(data_dir) if remote else os.path.abspath(data_dir),
        dead_dir=str(dead_dir) if remote else os.path.abspath(dead_dir),
        store=storage.current().to_json() if remote else None,
        max_batch_rows=max_batch_rows or DEFAULT_MAX_BATCH_ROWS,
        format_files=schema_files(spec.data_schema, spec_dir),
        table_types=plain_types(table_schema) if spec.data_schema.schema_discovery else {},
    )


def plain_types(schema: pa.Schema | None) -> dict[str, pa.DataType]:
    """A table's columns as the tasks' Arrow types (pyiceberg hands large strings and
    lists, nested ones too, and field ids as metadata)."""
    return {f.name: _plain(f.type) for f in (schema or [])}


def _plain(t: pa.DataType) -> pa.DataType:
    if t == pa.large_string():
        return pa.string()
    if t == pa.large_binary():
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_plain(t.key_type), _plain(t.item_type))
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _plain(t.value_type), t.value_field.nullable))
    return t
