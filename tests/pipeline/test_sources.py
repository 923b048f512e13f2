"""The range data sources: splitting, options, Arrow batches through Spark."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.model import KafkaSource, PartitionRange, RabbitSource
from reconciler.pipeline import sources
from reconciler.pipeline.sources import (
    ARROW_SCHEMA,
    RangesPartition,
    conform,
    read_options,
    source_from_document,
    source_to_document,
    split_ranges,
)
from reconciler.streams.base import RECORD_COLUMNS, RECORD_SCHEMA

R = PartitionRange


# --------------------------------------------------------------------------- splitting


def test_split_even_partitions_are_not_cut():
    ranges = [R(str(p), 100, 200) for p in range(4)]
    assert split_ranges(ranges, 4) == [[r] for r in ranges]
    assert split_ranges(ranges, 2) == [ranges[:2], ranges[2:]]
    assert split_ranges(ranges, 1) == [ranges]


def test_split_big_range_into_sub_ranges():
    groups = split_ranges([R("0", 10, 1010), R("1", 0, 0), R("2", 5, 5)], 3)
    assert groups == [[R("0", 10, 343)], [R("0", 343, 676)], [R("0", 676, 1010)]]


def test_split_more_tasks_than_offsets_and_empty():
    assert split_ranges([R("0", 0, 2)], 5) == [[R("0", 0, 1)], [R("0", 1, 2)]]
    assert split_ranges([R("0", 3, 3), R("1", 9, 2)], 4) == []
    assert split_ranges([], 3) == []


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 5000)), max_size=8),
    n=st.integers(1, 12),
)
def test_split_covers_every_offset_once_and_balances(sizes, n):
    ranges = [R(f"p{i}", start, start + size) for i, (start, size) in enumerate(sizes)]
    groups = split_ranges(ranges, n)
    total = sum(r.size for r in ranges)
    assert len(groups) == (min(n, total) if total else 0)
    counts = [sum(r.size for r in g) for g in groups]
    if counts:
        assert max(counts) - min(counts) <= 1
    assert all(r.size > 0 for g in groups for r in g)
    covered: dict[str, list[tuple[int, int]]] = {}
    for g in groups:
        for r in g:
            covered.setdefault(r.partition, []).append((r.start, r.end))
    for r in ranges:
        spans = sorted(covered.get(r.partition, []))
        if r.size == 0:
            assert spans == []
            continue
        assert spans[0][0] == r.start and spans[-1][1] == r.end
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))


# --------------------------------------------------------------------------- options


def test_source_documents_keep_secret_references():
    k = KafkaSource("b:9092", "t", {"sasl.password": "${env:KAFKA_PW}", "fetch.min.bytes": 1})
    r = RabbitSource("rabbitmq-stream://u:${file:/run/pw}@h:5552/%2f", ("s0", "s1"))
    for src in (k, r):
        doc = source_to_document(src)
        assert source_from_document(json.loads(json.dumps(doc))) == src
    opts = read_options(k, [R("0", 0, 10)], 2, maxBatchRows=100)
    assert "${env:KAFKA_PW}" in opts["source"]
    assert json.loads(opts["ranges"]) == [{"partition": "0", "start": 0, "end": 10}]
    assert opts["taskCount"] == "2" and opts["maxBatchRows"] == "100"
    assert sources.format_name(k) == "kafka_range"
    assert sources.format_name(r) == "rabbitmq_range"


def test_reader_partitions_and_read_without_spark():
    opts = read_options(KafkaSource("b", "t"), [R("0", 0, 10), R("1", 0, 5)], 2)
    reader = sources.KafkaRangeReader(opts)
    parts = reader.partitions()
    assert [p.ranges for p in parts] == [[R("0", 0, 7)], [R("0", 7, 10), R("1", 0, 5)]]
    assert all(isinstance(p, RangesPartition) for p in parts)
    import pickle

    assert pickle.loads(pickle.dumps(parts[1])).ranges == parts[1].ranges
    # InputPartition(None): what Spark hands read() when partitions() was empty.
    assert list(reader.read(sources.InputPartition(None))) == []


def test_conform_casts_to_spark_arrow_schema(fakes):
    b = fakes.make_batch("0", 0, 3)
    assert b.schema.equals(RECORD_SCHEMA)
    c = conform(b)
    assert c.schema.equals(ARROW_SCHEMA)
    assert (
        c.column("stream_time").cast(pa.timestamp("ms", tz="UTC")).equals(b.column("stream_time"))
    )
    assert conform(c) is c


def test_one_record_schema_the_others_derived():
    """RECORD_SCHEMA, ARROW_SCHEMA and the Spark schema are one definition (issue 16)."""
    assert tuple(RECORD_SCHEMA.names) == tuple(ARROW_SCHEMA.names) == RECORD_COLUMNS
    assert tuple(sources.SPARK_RECORD_SCHEMA.fieldNames()) == RECORD_COLUMNS
    assert ARROW_SCHEMA.field("stream_time").type == pa.timestamp("us", tz="UTC")
    assert RECORD_SCHEMA.field("stream_time").type == pa.timestamp("ms", tz="UTC")
    assert sources.SPARK_RECORD_SCHEMA.simpleString() == (
        "struct<partition:string,offset:bigint,key:binary,value:binary,stream_time:timestamp>"
    )


# --------------------------------------------------------------------------- through Spark


def _load(spark, fakes, ranges, tasks, **extra):
    fakes.register(spark)
    opts = read_options(KafkaSource("unused:1", "t"), ranges, tasks, **extra)
    return spark.read.format("fake_range").options(**opts).load()


@pytest.mark.spark
@pytest.mark.parametrize("tasks", [1, 3, 8])
def test_fake_source_reads_every_offset_once(spark, fakes, tasks):
    ranges = [R("0", 0, 1000), R("1", 500, 1700), R("2", 7, 7)]
    df = _load(spark, fakes, ranges, tasks, maxBatchRows=128)
    assert df.rdd.getNumPartitions() == tasks
    assert df.schema.simpleString() == (
        "struct<partition:string,offset:bigint,key:binary,value:binary,stream_time:timestamp>"
    )
    t = df.toArrow()
    got = sorted(
        zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True)
    )
    assert got == [("0", o) for o in range(1000)] + [("1", o) for o in range(500, 1700)]
    rows = t.to_pylist()
    assert all(r["key"] == f"{r['partition']}-{r['offset']}".encode() for r in rows)


@pytest.mark.spark
def test_no_ranges_reads_nothing(spark, fakes):
    assert _load(spark, fakes, [], 3).count() == 0
    assert _load(spark, fakes, [R("0", 5, 5)], 2).count() == 0


@pytest.mark.spark
def test_registered_sources_load(spark):
    # Registered by get_session(); an empty range list never contacts a broker.
    for fmt, src in (
        ("kafka_range", KafkaSource("127.0.0.1:1", "t")),
        ("rabbitmq_range", RabbitSource("rabbitmq-stream://h:1/%2f", ("s",))),
    ):
        df = spark.read.format(fmt).options(**read_options(src, [], 2)).load()
        assert df.count() == 0


def test_fake_reader_contract(fakes):
    batches = list(fakes.FakeStreamReader().read(R("x", 3, 10), 4))
    assert [b.num_rows for b in batches] == [4, 3]
