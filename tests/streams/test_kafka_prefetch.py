"""Reads whose fetches bring far more than their ranges hold, or less: with librdkafka's
default prefetch and with one sized to the ranges (a consumerProperties choice), with small
fetches, against the real Tansu broker, every range gives exactly its records (a partition
is paused as soon as a fetched run reaches its range's end)."""

from __future__ import annotations

import pytest

import devservices
from reconciler.model import KafkaSource, PartitionRange
from reconciler.streams.kafka import KafkaRangeReader

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

OLD = {"queued.min.messages": 100000}  # librdkafka's default


def _read(broker, name, ranges, **props):
    reader = KafkaRangeReader(KafkaSource(bootstrap_servers=broker.bootstrap, topic=name,
                                          consumer_properties=props), timeout=20)
    got: dict[str, list[int]] = {}
    for rng, b in reader.read_many(ranges):
        got.setdefault(rng.partition, []).extend(b.column("offset").to_pylist())
    return got


def test_large_reads_give_exactly_their_records_with_either_prefetch(kafka_broker, topic):
    """200,000 records over 4 partitions, with the default prefetch and with one of 5,000
    messages, and with small fetches."""
    name = topic(partitions=4)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(200_000),
                                     partition_of=lambda k, v: int(k[1:]) % 4)
    ranges = [PartitionRange(str(p), 0, end) for p, end in sorted(ends.items())]
    for extra in ({}, {"max.partition.fetch.bytes": 262144}):
        for props in (OLD, {"queued.min.messages": 5000}):
            assert _read(kafka_broker, name, ranges, **props, **extra) == \
                {str(p): list(range(end)) for p, end in ends.items()}, (props, extra)


def test_ranges_in_the_middle_and_at_the_end_read_exactly_their_records(kafka_broker, topic):
    """Ranges whose fetches return far more than they hold (a 5-record range in a 50,000-record
    partition) or start mid-batch: each offset once, none outside."""
    name = topic(partitions=3)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(60_000),
                                     partition_of=lambda k, v: int(k[1:]) % 3)
    cases = [
        [PartitionRange("0", 7, 12), PartitionRange("1", 19_000, 19_999), PartitionRange("2", 0, 1)],
        [PartitionRange(str(p), end - 1, end) for p, end in sorted(ends.items())],
        [PartitionRange("0", 3, ends[0]), PartitionRange("1", 5, 6)],
    ]
    for ranges in cases:
        got = _read(kafka_broker, name, ranges)
        assert got == {r.partition: list(range(r.start, r.end)) for r in ranges}, ranges
