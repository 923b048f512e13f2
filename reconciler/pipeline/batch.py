"""One batch: read offset ranges through Spark, transform, stage segments.

No database here: the caller publishes the returned ``StagedBatch`` (segments and
checkpoint move in one compare-and-swap transaction), then ``segments.promote``s it,
or ``segments.discard``s it when the publish lost.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence

from pyspark.sql import DataFrame, Observation, SparkSession

from reconciler.pipeline import segments as seg
from reconciler.pipeline.sources import format_name, read_options
from reconciler.pipeline.transform import dead_rows, good_rows, parse
from reconciler.spec.model import Source, SupervisorSpec
from reconciler.streams.base import PartitionRange


def read_ranges(
    spark: SparkSession,
    source: Source,
    ranges: Sequence[PartitionRange],
    task_count: int,
    max_batch_rows: int | None = None,
) -> DataFrame:
    """The records of ``ranges`` as a DataFrame (``RECORD_SCHEMA`` columns)."""
    extra = {"maxBatchRows": max_batch_rows} if max_batch_rows else {}
    return (
        spark.read.format(format_name(source))
        .options(**read_options(source, ranges, task_count, **extra))
        .load()
    )


def _observed(obs: Observation, key: str) -> int | None:
    try:
        value = obs.get.get(key)
    except Exception:  # noqa: BLE001 - an observation the optimizer pruned away
        return None
    return None if value is None else int(value)


def run_batch(
    spark: SparkSession,
    spec: SupervisorSpec,
    ranges: Sequence[PartitionRange],
    segments_dir: str | os.PathLike[str],
    batch_id: str,
    task_count: int | None = None,
    *,
    max_batch_rows: int | None = None,
) -> seg.StagedBatch:
    """Read ``ranges`` of ``spec.source``, transform, and stage the segments.

    One Spark job reads the stream once, parses and writes segment files; the number
    of dead letters is observed during that job, and only when there are some does a
    second job (reading the ranges again) write them.
    """
    ds = spec.data_schema
    seg.check_batch_id(batch_id)
    tasks = max(1, int(task_count or spec.task_count or 1))
    live = [r for r in ranges if r.size > 0]
    if not live:
        staged = seg.StagedBatch(
            batch_id=batch_id,
            datasource=ds.datasource,
            files=(),
            rows=0,
            dead_rows=0,
            segments_dir=str(os.path.abspath(segments_dir)),
            segment_granularity=ds.segment_granularity,
            input_rows=0,
        )
        seg.discard(segments_dir, batch_id)
        seg.write_manifest(staged)
        return staged

    records = read_ranges(spark, spec.source, live, tasks, max_batch_rows)
    obs = Observation(f"batch-{batch_id}-{uuid.uuid4().hex[:8]}")
    return seg.write_batch(
        spark,
        good_rows(parse(records, ds, observation=obs), ds),
        dead_rows(parse(records, ds)),
        segments_dir,
        ds.datasource,
        batch_id,
        segment_granularity=ds.segment_granularity,
        dead_count=lambda: _observed(obs, "dead"),
        input_rows=lambda: _observed(obs, "records"),
    )
