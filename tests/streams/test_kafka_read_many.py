"""KafkaRangeReader.read_many: several partitions' ranges read by one consumer at once.

Each range must give exactly what ``read`` gives for it alone (every offset of the range
once, in offset order, none outside it), whatever the other ranges do: end early, end
empty, end at a transaction marker, or never be served.
"""

from __future__ import annotations

import collections
import time

import pytest

import devservices
from reconciler.errors import RetryableError
from reconciler.model import KafkaSource, PartitionRange
from reconciler.pipeline.tasks import _read_all
from reconciler.streams.base import RECORD_SCHEMA
from reconciler.streams.kafka import KafkaRangeReader

pytestmark = [pytest.mark.kafka, pytest.mark.integration]


def _source(broker, topic: str, **props: object) -> KafkaSource:
    return KafkaSource(bootstrap_servers=broker.bootstrap, topic=topic, consumer_properties=props)


def _by_range(pairs, max_batch_rows: int) -> dict[str, list[tuple[int, bytes]]]:
    out: dict[str, list[tuple[int, bytes]]] = collections.defaultdict(list)
    for rng, batch in pairs:
        assert batch.schema == RECORD_SCHEMA
        assert 0 < batch.num_rows <= max_batch_rows
        assert set(batch.column("partition").to_pylist()) == {rng.partition}
        out[rng.partition].extend(zip(batch.column("offset").to_pylist(), batch.column("key").to_pylist(),
                                      strict=True))
    return out


@pytest.mark.parametrize("one_record_per_batch", [False, True], ids=["bulk", "single"])
def test_each_range_reads_exactly_what_it_reads_alone(kafka_broker, topic, one_record_per_batch):
    name = topic(partitions=4)
    n = 4000 if not one_record_per_batch else 400
    records = devservices.make_records(n)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records,
                                     one_record_per_batch=one_record_per_batch)
    # ranges of different lengths: from the start, in the middle, a single record, empty
    e = {str(p): end for p, end in ends.items()}
    ranges = [PartitionRange("0", 0, e["0"]), PartitionRange("1", e["1"] // 3, e["1"] - 7),
              PartitionRange("2", 5, 6), PartitionRange("3", 9, 9)]
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=10)
    together = _by_range(reader.read_many(ranges, 13), 13)
    for rng in ranges:
        alone = [(o, k) for b in reader.read(rng, 13)
                 for o, k in zip(b.column("offset").to_pylist(), b.column("key").to_pylist(), strict=True)]
        got = together.get(rng.partition, [])
        assert got == alone, f"range {rng} read together differs from alone"
        assert [o for o, _ in got] == list(range(rng.start, rng.end))
        keys = collections.Counter(k for _, k in got)
        assert not keys or max(keys.values()) == 1, "a key twice"


def test_a_range_that_ends_early_takes_nothing_fetched_past_its_end(kafka_broker, topic):
    """One range is done after a few records while the other reads on: what the consumer
    already fetched of the first partition past its end is left out."""
    name = topic(partitions=2)
    records = devservices.make_records(6000)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    ranges = [PartitionRange("0", 10, 20), PartitionRange("1", 0, ends[1])]
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=10)
    got = _by_range(reader.read_many(ranges, 500), 500)
    assert [o for o, _ in got["0"]] == list(range(10, 20))
    assert [o for o, _ in got["1"]] == list(range(ends[1]))
    assert len({k for o, k in got["0"] + got["1"]}) == 10 + ends[1], "a key twice"
    produced = {key.encode() for key, _value in records}
    assert {k for o, k in got["0"] + got["1"]} <= produced


def test_a_range_never_served_fails_the_read_within_the_timeout_and_names_its_partition(kafka_broker, topic):
    name = topic(partitions=2)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(50))
    ranges = [PartitionRange("0", 0, ends[0]), PartitionRange("1", 0, ends[1] + 5)]
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=2)
    got: dict[str, list[int]] = collections.defaultdict(list)
    started = time.monotonic()
    with pytest.raises(RetryableError, match=f"{name}/1.*not available"):
        for rng, batch in reader.read_many(ranges, 7):
            got[rng.partition].extend(batch.column("offset").to_pylist())
    assert time.monotonic() - started < 8
    assert got["0"] == list(range(ends[0])), "the served range was read whole before the failure"
    assert all(0 <= o < ends[1] for o in got["1"])


def test_transaction_markers_end_each_range(kafka_broker, topic):
    """A commit marker takes the last offset of each partition: no range waits for it."""
    from confluent_kafka import Producer

    name = topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"tx-{name}",
                         "batch.num.messages": 1, "linger.ms": 0})
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(name, key=b"k%d" % i, value=b"v", partition=i % 2)
    producer.commit_transaction(10)
    reader = KafkaRangeReader(_source(kafka_broker, name, **{"isolation.level": "read_committed"}), timeout=5)
    started = time.monotonic()
    got = _by_range(reader.read_many([PartitionRange("0", 0, 6), PartitionRange("1", 0, 6)], 100), 100)
    assert [o for o, _ in got["0"]] == [0, 1, 2, 3, 4]
    assert [o for o, _ in got["1"]] == [0, 1, 2, 3, 4]
    assert sorted(k for _, k in got["0"] + got["1"]) == sorted(b"k%d" % i for i in range(10))
    assert time.monotonic() - started < 4, "waited for a marker's offset"


def test_two_ranges_of_one_partition_are_refused_and_a_task_reads_them_in_turn(kafka_broker, topic):
    name = topic(partitions=1)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(100),
                                     partition_of=lambda k, v: 0)
    ranges = [PartitionRange("0", 0, 40), PartitionRange("0", 40, ends[0])]
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=5)
    with pytest.raises(ValueError, match="one range per partition"):
        list(reader.read_many(ranges, 10))
    offsets = [o for rng, b in _read_all(reader, ranges, 10) for o in b.column("offset").to_pylist()]
    assert offsets == list(range(ends[0]))

