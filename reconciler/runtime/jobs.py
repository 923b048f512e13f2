"""The batch job a runtime runs: Spark, behind a two-method seam.

A runtime needs two things of the engine: the output schemas of a data schema (asked
once per spec) and one batch run over offset ranges into data files. ``SparkJob`` does
both through ``reconciler.pipeline`` and translates Spark's failures into ours. The seam
is what lets the schedule explorer (``tests/explorer``) drive the real runtime, store and
table code with a job that writes Parquet files with pyarrow instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from reconciler.model import DataSchema, PartitionRange, SupervisorSpec


class BatchJob(Protocol):
    def schemas(self, data_schema: DataSchema) -> tuple[Any, Any]:
        """(row schema, dead-letter schema) as Arrow schemas."""

    def run(self, spec: SupervisorSpec, ranges: Sequence[PartitionRange], batch_id: str, *,
            data_dir: Path, dead_dir: Path, task_count: int) -> Any:
        """Write the batch's files (a ``pipeline.segments.WrittenBatch``), durable, uncommitted."""


class SparkJob:
    """The product's job: a Spark session (started lazily by ``spark``) runs the batch."""

    def __init__(self, spark: Callable[[], Any]):
        self._spark = spark

    def schemas(self, data_schema: DataSchema) -> tuple[Any, Any]:
        from reconciler.pipeline.batch import output_schemas

        return _translated(lambda: output_schemas(self._spark(), data_schema))

    def run(self, spec: SupervisorSpec, ranges: Sequence[PartitionRange], batch_id: str, *,
            data_dir: Path, dead_dir: Path, task_count: int, spec_dir: str | None = None,
            table_schema: Any = None) -> Any:
        from reconciler.pipeline.batch import run_batch

        return _translated(lambda: run_batch(self._spark(), spec, ranges, batch_id, data_dir=data_dir,
                                             dead_dir=dead_dir, task_count=task_count, spec_dir=spec_dir,
                                             table_schema=table_schema))


def _translated(call: Callable[[], Any]) -> Any:
    """Spark's failures as ours (a lost cluster, a misconfiguration), others as they are."""
    from reconciler.pipeline.spark import translate_failure

    try:
        return call()
    except Exception as exc:
        translated = translate_failure(exc)
        if translated is not exc:
            raise translated from exc
        raise
