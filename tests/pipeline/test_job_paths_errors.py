"""A worker's error reads the same in status on the RDD path as on the mapInArrow path."""

from __future__ import annotations

import sys

import pytest

from reconciler.model import DataSchema, KafkaSource, source_to_document
from reconciler.model import PartitionRange as R
from reconciler.pipeline import tasks
from reconciler.pipeline.sources import split_ranges
from reconciler.pipeline.worker_errors import product_message

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SINGLE = "offsets [500, 8500) of stream 'x' are no longer available (deleted by retention)"
MULTI = "schema registry http://r:8081 answered 503:\nService Unavailable\nretry later"


DS = DataSchema(datasource="t", timestamp_column="ts", dimensions=("k",), segment_granularity="hour")


def plan(fakes, tmp_path, ranges, task_count, reader, name):
    return tasks.TaskPlan(
        source=source_to_document(KafkaSource("unused:1", "t")), data_schema=DS,
        groups=tuple(tuple(g) for g in split_ranges(ranges, task_count)),
        data_dir=str(tmp_path / "t" / "data" / f"batch={name}"),
        dead_dir=str(tmp_path / "t_dl" / "data" / f"batch={name}"),
        store=None, max_batch_rows=128, reader=reader)


def readers(base):
    class PermanentReader(base):
        def read(self, rng, max_batch_rows=65536):
            from reconciler.errors import PermanentError

            raise PermanentError(SINGLE)

    class MultiLineReader(base):
        def read(self, rng, max_batch_rows=65536):
            from reconciler.errors import RetryableError

            raise RetryableError(MULTI)

    class RegistryReader(base):
        def read(self, rng, max_batch_rows=65536):
            from reconciler.pipeline.formats.registry import RegistryUnavailable

            raise RegistryUnavailable(SINGLE)

    return {"permanent": PermanentReader, "multi": MultiLineReader, "registry": RegistryReader}


def _paths(spark):
    return (("rdd", lambda p: tasks._collect_rdd(spark.sparkContext, p, len(p.groups))),
            ("frame", lambda p: tasks._collect_frame(spark, p, len(p.groups))))


@pytest.mark.parametrize("which", ["permanent", "multi", "registry"])
def test_a_workers_error_reads_the_same_on_both_paths(spark, fakes, tmp_path, which):
    reader = readers(fakes.FakeStreamReader)[which]
    found = {}
    for name, collect in _paths(spark):
        p = plan(fakes, tmp_path / name, [R("0", 0, 10)], 1, reader=reader, name=name)
        with pytest.raises(Exception) as info:  # noqa: B017
            collect(p)
        print(name, type(info.value), repr(str(info.value)[:6000]), file=sys.stderr)
        found[name] = product_message(info.value)
    print(found, file=sys.stderr)
    assert found["rdd"] == found["frame"]
    assert found["rdd"] is not None
