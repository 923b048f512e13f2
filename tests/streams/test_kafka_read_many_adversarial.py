"""Adversarial checks of ``KafkaRangeReader.read_many`` and ``KafkaAdapter.latest`` against Tansu.

Contract (reader module docstring): each range gives exactly the records with offsets in
``[start, end)``, in offset order, none outside, none twice; a range never served fails
within ``timeout`` (RetryableError naming the partition); records gone by retention are a
PermanentError.
"""

from __future__ import annotations

import collections
import time

import pytest
from confluent_kafka import Producer

import devservices
from reconciler.errors import RetryableError
from reconciler.model import KafkaSource, PartitionRange
from reconciler.streams.kafka import KafkaRangeReader
from reconciler.streams.kafka import reader as reader_module
from reconciler.streams.kafka.adapter import KafkaAdapter

pytestmark = [pytest.mark.kafka, pytest.mark.integration]


def _source(broker, topic: str, **props: object) -> KafkaSource:
    return KafkaSource(bootstrap_servers=broker.bootstrap, topic=topic, consumer_properties=props)


def _rows(pairs, max_batch_rows: int) -> dict[str, list[tuple[int, bytes, bytes]]]:
    out: dict[str, list[tuple[int, bytes, bytes]]] = collections.defaultdict(list)
    for rng, batch in pairs:
        assert 0 < batch.num_rows <= max_batch_rows
        assert set(batch.column("partition").to_pylist()) == {rng.partition}
        out[rng.partition].extend(zip(batch.column("offset").to_pylist(), batch.column("key").to_pylist(),
                                      batch.column("value").to_pylist(), strict=True))
    return dict(out)


def _truth(broker, name: str, partitions: int) -> dict[str, list[tuple[int, bytes, bytes]]]:
    """Every record of every partition, read by a bare consumer (read_uncommitted)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "truth", "enable.partition.eof": True,
                  "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    c.assign([TopicPartition(name, p, 0) for p in range(partitions)])
    out: dict[str, list] = {str(p): [] for p in range(partitions)}
    eof: set[int] = set()
    deadline = time.monotonic() + 20
    while len(eof) < partitions and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            if m.error():
                eof.add(m.partition())
                continue
            out[str(m.partition())].append((m.offset(), m.key(), m.value()))
    c.close()
    assert len(eof) == partitions
    return out


# --------------------------------------------------------------------------- read_many


def test_sixteen_partitions_tiny_ranges_same_rows_at_every_batch_size(kafka_broker, topic):
    """16 partitions, one record per batch, ranges of 0..3 records at the start, the middle and
    the very end (EOF in the same fetch), read together at batch sizes 1, 2, 3 and 1000: each
    range gives exactly its records, the same at every cut."""
    parts = 16
    name = topic(partitions=parts)
    records = devservices.make_records(16 * 12)
    devservices.produce_kafka(kafka_broker.bootstrap, name, records, one_record_per_batch=True,
                              partition_of=lambda k, v: int(k[1:]) % parts)
    truth = _truth(kafka_broker, name, parts)
    ranges = []
    for p in range(parts):
        n = len(truth[str(p)])
        kind = p % 4
        if kind == 0:
            ranges.append(PartitionRange(str(p), 0, 1))
        elif kind == 1:
            ranges.append(PartitionRange(str(p), n - 3, n))  # ends at the partition's end
        elif kind == 2:
            ranges.append(PartitionRange(str(p), 4, 4))  # empty
        else:
            ranges.append(PartitionRange(str(p), 5, 7))
    reader = KafkaRangeReader(_source(kafka_broker, name, **{"isolation.level": "read_uncommitted"}), timeout=10)
    seen = None
    for size in (1, 2, 3, 1000):
        got = _rows(reader.read_many(ranges, size), size)
        for rng in ranges:
            want = [r for r in truth[rng.partition] if rng.start <= r[0] < rng.end]
            assert got.get(rng.partition, []) == want, (size, rng)
        if seen is not None:
            assert got == seen
        seen = got


def test_a_one_record_range_beside_a_long_one_with_tiny_fetches(kafka_broker, topic):
    """Tiny fetches (~1 KB a partition) make many fetch responses that alternate the two
    partitions (A B A B ...): the one-record range is done in the first, is paused while its
    prefetched records keep coming; the long range must be read whole, once, in order, with
    nothing of the other partition in it. Repeated: the interleaving differs run to run."""
    name = topic(partitions=2)
    records = devservices.make_records(3000)
    devservices.produce_kafka(kafka_broker.bootstrap, name, records, partition_of=lambda k, v: int(k[1:]) % 2)
    truth = _truth(kafka_broker, name, 2)
    props = {"isolation.level": "read_uncommitted", "max.partition.fetch.bytes": 1024, "fetch.max.bytes": 2048, "message.max.bytes": 2048,
             "queued.min.messages": 10}
    reader = KafkaRangeReader(_source(kafka_broker, name, **props), timeout=10)
    for rngs in ([PartitionRange("0", 0, 1), PartitionRange("1", 0, len(truth["1"]))],
                 [PartitionRange("0", 0, len(truth["0"])), PartitionRange("1", 7, 8)],
                 [PartitionRange("0", 100, 1400), PartitionRange("1", 1, 1200)]):
        for size in (1, 97):
            got = _rows(reader.read_many(rngs, size), size)
            for rng in rngs:
                want = [r for r in truth[rng.partition] if rng.start <= r[0] < rng.end]
                assert got[rng.partition] == want, (rng, size)


def test_single_range_read_looks_at_no_message_partition(kafka_broker, topic, monkeypatch):
    """With one partition read, cutting a chunk into runs costs nothing per message."""
    name = topic(partitions=1)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(5000),
                                     partition_of=lambda k, v: 0)
    calls = [0]
    real = reader_module._PARTITION

    def counting(m):
        calls[0] += 1
        return real(m)

    monkeypatch.setattr(reader_module, "_PARTITION", counting)
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=10)
    n = sum(b.num_rows for b in reader.read(PartitionRange("0", 0, ends[0]), 1000))
    assert n == ends[0]
    # two ranges of which one is empty: one partition read as well
    n = sum(b.num_rows for _r, b in reader.read_many([PartitionRange("0", 0, ends[0]), PartitionRange("1", 3, 3)],
                                                     1000))
    assert n == ends[0]
    assert calls[0] == 0


def test_a_range_past_the_end_of_one_partition_fails_naming_it(kafka_broker, topic):
    """OFFSET_OUT_OF_RANGE on one partition (its range starts past its end) while the other is
    served: a RetryableError naming that partition, within the timeout."""
    name = topic(partitions=2)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(200),
                                     partition_of=lambda k, v: int(k[1:]) % 2)
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=3)
    ranges = [PartitionRange("0", 0, ends[0]), PartitionRange("1", ends[1] + 10, ends[1] + 20)]
    got: dict[str, list[int]] = collections.defaultdict(list)
    started = time.monotonic()
    with pytest.raises(RetryableError, match=f"{name}/1"):
        for rng, b in reader.read_many(ranges, 50):
            got[rng.partition].extend(b.column("offset").to_pylist())
    assert time.monotonic() - started < 3 + 3
    assert got["0"] == list(range(len(got["0"])))
    assert "1" not in got


# --------------------------------------------------------------------------- the stall path


class _Starving:
    """A consumer whose broker answers one partition's fetches with nothing: its records are
    dropped before the reader sees them (librdkafka's position still moves past them, as it
    would not on a real stall, which makes a re-read from the wrong position visible)."""

    def __init__(self, consumer, starved: set[int]):
        self._c = consumer
        self.starved = starved

    def consume(self, num_messages=1, timeout=-1):
        msgs = self._c.consume(num_messages=num_messages, timeout=timeout)
        return [m for m in msgs if m.partition() not in self.starved]

    def __getattr__(self, name):
        return getattr(self._c, name)


def _starving_reader(reader: KafkaRangeReader, starved_per_consumer: list[set[int]]) -> list[int]:
    """Each new consumer of ``reader`` starves the partitions of the next entry (none once
    the list is used up); returns the list of fetch waits the consumers were made with."""
    made: list[int] = []
    real = reader._consumer

    def make(*args):
        consumer, errors = real(*args)
        made.append(reader._fetch_wait or 0)
        starved = starved_per_consumer.pop(0) if starved_per_consumer else set()
        return _Starving(consumer, starved), errors

    reader._consumer = make
    return made


@pytest.mark.parametrize("served_done_first", [True, False], ids=["served-done", "served-unbounded"])
def test_stall_of_one_partition_rereads_it_from_its_position_once(kafka_broker, topic, served_done_first):
    """p1 starved by the first consumer while p0 is served: after the stall the reader asks
    again with a new consumer at each remaining partition's position. p1 must come whole
    and once; p0 (done, or waiting for records never produced) neither twice nor lost."""
    name = topic(partitions=2)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(400),
                                     partition_of=lambda k, v: int(k[1:]) % 2)
    truth = _truth(kafka_broker, name, 2)
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=5)
    made = _starving_reader(reader, [{1}])
    end0 = ends[0] if served_done_first else ends[0] + 3
    ranges = [PartitionRange("0", 0, end0), PartitionRange("1", 0, ends[1])]
    got: dict[str, list] = collections.defaultdict(list)
    try:
        for rng, b in reader.read_many(ranges, 33):
            got[rng.partition].extend(zip(b.column("offset").to_pylist(), b.column("key").to_pylist(),
                                          b.column("value").to_pylist(), strict=True))
    except RetryableError as exc:
        assert not served_done_first, exc
        assert f"{name}/0" in str(exc)
    assert len(made) == 2, "a stall with records on the broker asks once more"
    assert got["1"] == truth["1"]
    if served_done_first:
        assert got["0"] == truth["0"]
    else:  # failed: what was yielded is a prefix, nothing twice
        assert got["0"] == truth["0"][:len(got["0"])]


def test_a_partition_starved_for_good_fails_the_read_within_the_timeout(kafka_broker, topic):
    """The broker holds p1's records but never serves them (every consumer starved): the read
    must fail within ``timeout`` (module contract, and the stall path's own comment: "a broker
    that cannot answer must still fail the read within timeout"), naming p1, after p0 was read
    whole. Each longer-wait retry resets the no-progress clock, so it fails after
    ~2 s + ~2 s + timeout. Inherited from the old single-range ``read`` (same code; it took
    10 s at timeout 4 s there), kept by ``read_many``."""
    name = topic(partitions=2)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(100),
                                     partition_of=lambda k, v: int(k[1:]) % 2)
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=4)
    made = _starving_reader(reader, [{1}, {1}, {1}, {1}])
    got: dict[str, list[int]] = collections.defaultdict(list)
    started = time.monotonic()
    with pytest.raises(RetryableError, match=f"{name}/1"):
        for rng, b in reader.read_many([PartitionRange("0", 0, ends[0]), PartitionRange("1", 0, ends[1])], 10):
            got[rng.partition].extend(b.column("offset").to_pylist())
    took = time.monotonic() - started
    assert got["0"] == list(range(ends[0]))
    assert took < 4 + 1.5, f"failed after {took:.1f}s with timeout 4s ({len(made)} consumers)"


def test_multi_record_last_batches_ranges_to_latest_and_to_the_true_end(kafka_broker, topic):
    """Tansu's latest is the last batch's base offset + 1 when that batch holds several
    records: a range up to ``latest()`` stops inside the batch (nothing past it), one up to
    the true end takes the rest, with the other partitions' ranges read alongside."""
    name = topic(partitions=3)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 200, "batch.num.messages": 1000})
    for i in range(300):
        producer.produce(name, key=b"m%d" % i, value=b"v%d" % i, partition=i % 3)
    producer.flush(10)
    truth = _truth(kafka_broker, name, 3)
    latest = KafkaAdapter(_source(kafka_broker, name), timeout=5).latest()
    assert latest["0"] < len(truth["0"]) and latest["2"] < len(truth["2"]), "no multi-record last batch"
    assert latest == {p: h for p, (_l, h) in KafkaAdapter(_source(kafka_broker, name), timeout=5).watermarks().items()}
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=5)
    ranges = [PartitionRange("0", 0, latest["0"]), PartitionRange("1", 0, len(truth["1"])),
              PartitionRange("2", latest["2"], len(truth["2"]))]
    for size in (1, 64):
        got = _rows(reader.read_many(ranges, size), size)
        for rng in ranges:
            want = [r for r in truth[rng.partition] if rng.start <= r[0] < rng.end]
            assert got.get(rng.partition, []) == want, (rng, size)


def test_one_unserved_range_among_sixteen_fails_naming_it(kafka_broker, topic):
    """15 ranges served whole, one (p9) whose end is past its partition's end: a RetryableError
    naming p9 within the timeout, after every served range was yielded whole and once."""
    parts = 16
    name = topic(partitions=parts)
    devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(parts * 5),
                              one_record_per_batch=True, partition_of=lambda k, v: int(k[1:]) % parts)
    truth = _truth(kafka_broker, name, parts)
    ranges = [PartitionRange(str(p), 1, len(truth[str(p)]) + (2 if p == 9 else 0)) for p in range(parts)]
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=2)
    got: dict[str, list] = collections.defaultdict(list)
    started = time.monotonic()
    with pytest.raises(RetryableError, match=f"{name}/9\\b.*not available"):
        for rng, b in reader.read_many(ranges, 2):
            got[rng.partition].extend(b.column("offset").to_pylist())
    assert time.monotonic() - started < 2 + 2
    for p in range(parts):
        if p != 9:
            assert got[str(p)] == list(range(1, len(truth[str(p)]))), p
    assert got["9"] == list(range(1, len(got["9"]) + 1))


# --------------------------------------------------------------------------- KafkaAdapter.latest


def test_latest_answers_as_the_watermarks_did(kafka_broker, topic):
    """One ListOffsets(OFFSET_END) for all partitions gives each partition's high watermark as
    ``get_watermark_offsets`` did: empty partitions 0 (not -1), an open transaction under
    either isolation level, and a deleted then re-created topic read by a warm client."""
    name = topic(partitions=3)
    devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(20),
                              partition_of=lambda k, v: 1)
    tx = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"tx-{name}", "linger.ms": 0})
    tx.init_transactions(10)
    tx.begin_transaction()
    for i in range(5):
        tx.produce(name, key=b"t%d" % i, value=b"v", partition=2)
    tx.flush(10)
    try:
        for iso in ("read_committed", "read_uncommitted"):
            adapter = KafkaAdapter(_source(kafka_broker, name, **{"isolation.level": iso}), timeout=5)
            latest = adapter.latest()
            assert latest == {p: h for p, (_l, h) in adapter.watermarks().items()}, iso
            assert latest["0"] == 0 and latest["1"] == 20
    finally:
        tx.abort_transaction(10)
    # a warm client (partitions cached), the topic deleted, then re-created: latest() says
    # what the watermarks say (Tansu answers a deleted topic's partitions with 0 to a warm client)
    warm = [KafkaAdapter(_source(kafka_broker, name), timeout=3) for _ in range(2)]
    for adapter in warm:
        adapter.latest()
    kafka_broker.delete_topic(name)
    assert warm[0].latest() == {p: h for p, (_l, h) in warm[1].watermarks().items()}
    kafka_broker.create_topic(name, 3)
    devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(5), partition_of=lambda k, v: 0)
    assert warm[0].latest() == {p: h for p, (_l, h) in warm[1].watermarks().items()} == {"0": 5, "1": 0, "2": 0}
