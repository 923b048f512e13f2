"""A task's share of a batch: splitting ranges, the reader of a source, conformed batches."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.model import (
    KafkaSource,
    PartitionRange,
    RabbitSource,
    source_from_document,
    source_to_document,
)
from reconciler.pipeline import sources
from reconciler.pipeline.sources import ARROW_SCHEMA, conform, split_ranges
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


# --------------------------------------------------------------------------- readers


def test_source_documents_keep_secret_references():
    k = KafkaSource("b:9092", "t", {"sasl.password": "${env:KAFKA_PW}", "fetch.min.bytes": 1})
    r = RabbitSource("rabbitmq-stream://u:${file:/run/pw}@h:5552/%2f", ("s0", "s1"))
    for src in (k, r):
        doc = source_to_document(src)
        assert source_from_document(json.loads(json.dumps(doc))) == src
    assert "${env:KAFKA_PW}" in json.dumps(source_to_document(k))
    assert sources.ranges_from_json(sources.ranges_to_json([R("0", 0, 10)])) == [R("0", 0, 10)]


def test_a_task_opens_the_reader_of_its_source_type():
    from reconciler.streams.kafka import KafkaRangeReader
    from reconciler.streams.rabbitmq import RabbitRangeReader

    kafka = sources.open_reader(source_to_document(KafkaSource("127.0.0.1:1", "t")))
    rabbit = sources.open_reader(source_to_document(RabbitSource("rabbitmq-stream://h:1/%2f", ("s",))))
    try:
        assert isinstance(kafka, KafkaRangeReader) and isinstance(rabbit, RabbitRangeReader)
    finally:
        for reader in (kafka, rabbit):
            getattr(reader, "close", lambda: None)()


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
    """RECORD_SCHEMA and ARROW_SCHEMA are one definition (issue 16)."""
    assert tuple(RECORD_SCHEMA.names) == tuple(ARROW_SCHEMA.names) == RECORD_COLUMNS
    assert ARROW_SCHEMA.field("stream_time").type == pa.timestamp("us", tz="UTC")
    assert RECORD_SCHEMA.field("stream_time").type == pa.timestamp("ms", tz="UTC")


def test_fake_reader_contract(fakes):
    batches = list(fakes.FakeStreamReader().read(R("x", 3, 10), 4))
    assert [b.num_rows for b in batches] == [4, 3]
