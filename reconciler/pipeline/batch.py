"""One batch: read offset ranges through Spark, transform, write the data files.

No database here: the caller publishes the returned ``WrittenBatch`` (one table
commit with the checkpoints' compare-and-swap), or ``segments.discard``s it when the
publish lost.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Observation, SparkSession

from reconciler.model import DataSchema, PartitionRange, Source, SupervisorSpec
from reconciler.pipeline import segments as seg
from reconciler.pipeline.sources import SPARK_RECORD_SCHEMA, format_name, read_options
from reconciler.pipeline.transform import (
    CORRUPT_COLUMN,
    SEGMENT,
    dead_rows,
    good_rows,
    json_fields,
    parse,
)
from reconciler.table.schema import arrow_schema_of


def read_ranges(
    spark: SparkSession,
    source: Source,
    ranges: Sequence[PartitionRange],
    task_count: int,
    max_batch_rows: int | None = None,
    data_schema: DataSchema | None = None,
) -> DataFrame:
    """The records of ``ranges`` as a DataFrame (``RECORD_SCHEMA`` columns).

    With a ``data_schema``, the readers also parse its JSON fields
    (``reconciler.pipeline.jsonfields``), which ``transform.parse`` then uses, and shed
    the values of parsed records that cannot be dead letters (``shed_values``).
    """
    extra: dict[str, object] = {"maxBatchRows": max_batch_rows} if max_batch_rows else {}
    if data_schema is not None:
        extra.update(
            json_fields=json_fields(data_schema),
            json_corrupt_column=CORRUPT_COLUMN,
            json_timestamp=(data_schema.timestamp_column, data_schema.timestamp_format),
        )
    return (
        spark.read.format(format_name(source))
        .options(**read_options(source, ranges, task_count, **extra))
        .load()
    )


def output_schemas(spark: SparkSession, data_schema: DataSchema) -> tuple[pa.Schema, pa.Schema]:
    """The Arrow schemas of a datasource's rows (without ``time_chunk``) and of its dead
    letters, as the transform produces them: analysed over an empty frame, no job runs."""
    empty = spark.createDataFrame([], SPARK_RECORD_SCHEMA)
    good = good_rows(parse(empty, data_schema), data_schema).drop(SEGMENT)
    return arrow_schema_of(good.schema), arrow_schema_of(dead_rows(parse(empty, data_schema)).schema)


class _Observed:
    """An observation's metrics, fetched once (each fetch is a few py4j calls)."""

    def __init__(self, obs: Observation):
        self._obs = obs
        self._metrics: dict[str, Any] | None = None

    def __call__(self, key: str) -> int | None:
        if self._metrics is None:
            try:
                self._metrics = self._obs.get
            except Exception:  # noqa: BLE001 - an observation the optimizer pruned away
                self._metrics = {}
        value = self._metrics.get(key)
        return None if value is None else int(value)


def run_batch(
    spark: SparkSession,
    spec: SupervisorSpec,
    ranges: Sequence[PartitionRange],
    batch_id: str,
    *,
    data_dir: str | os.PathLike[str],
    dead_dir: str | os.PathLike[str],
    task_count: int | None = None,
    max_batch_rows: int | None = None,
) -> seg.WrittenBatch:
    """Read ``ranges`` of ``spec.source``, transform, and write the data files.

    One Spark job reads the stream once, parses and writes the rows; the number of dead
    letters is observed during that job, and only when there are some does a second job
    (reading the ranges again) write them.
    """
    ds = spec.data_schema
    seg.check_batch_id(batch_id)
    tasks = max(1, int(task_count or spec.task_count or 1))
    live = [r for r in ranges if r.size > 0]
    if not live:
        return seg.WrittenBatch(batch_id, (), (), input_rows=0)
    parse_in_reader = ds if ds.format == "json" else None
    records = read_ranges(
        spark, spec.source, live, tasks, max_batch_rows, data_schema=parse_in_reader
    )
    obs = Observation(f"batch-{batch_id}-{uuid.uuid4().hex[:8]}")
    observed = _Observed(obs)
    return seg.write_batch(
        spark,
        good_rows(parse(records, ds, observation=obs), ds, sink_chunks=True),
        lambda: dead_rows(parse(records, ds)),  # built only for a batch with dead letters
        data_dir,
        dead_dir,
        batch_id,
        dead_count=lambda: observed("dead"),
        input_rows=lambda: observed("records"),
        input_bytes=lambda: observed("bytes"),
        segment_granularity=ds.segment_granularity,
    )
