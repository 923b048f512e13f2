"""KafkaAdapter and KafkaRangeReader against a real broker (Tansu, via the session fixture).

Exact ends need single-record final batches on Tansu (see ``devservices``):
``produce_kafka`` always ends each partition that way, and ``one_record_per_batch``
makes every batch a single record.
"""

from __future__ import annotations

import collections
import time

import pyarrow as pa
import pytest

import devservices
from reconciler.errors import PermanentError, RetryableError
from reconciler.model import KafkaSource, PartitionRange
from reconciler.streams import adapter_for
from reconciler.streams.base import RECORD_SCHEMA
from reconciler.streams.kafka import KafkaAdapter, KafkaRangeReader, consumer_config

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

T0 = 1_700_000_000_000


def _source(broker: devservices.TansuBroker, topic: str, **props: object) -> KafkaSource:
    return KafkaSource(bootstrap_servers=broker.bootstrap, topic=topic, consumer_properties=props)


def _read_all(source: KafkaSource, ranges: list[PartitionRange], max_batch_rows: int) -> pa.Table:
    reader = KafkaRangeReader(source, timeout=10)
    batches = []
    for rng in ranges:
        for batch in reader.read(rng, max_batch_rows=max_batch_rows):
            assert batch.schema == RECORD_SCHEMA
            assert 0 < batch.num_rows <= max_batch_rows
            batches.append(batch)
    return pa.Table.from_batches(batches, schema=RECORD_SCHEMA)


def _split(partition: str, start: int, end: int, parts: int) -> list[PartitionRange]:
    cuts = sorted({start, end, *(start + (end - start) * i // parts for i in range(1, parts))})
    return [PartitionRange(partition, a, b) for a, b in zip(cuts, cuts[1:], strict=False)]


def test_partitions_are_numbered_strings(kafka_broker, topic):
    name = topic(partitions=3)
    adapter = adapter_for(_source(kafka_broker, name))
    assert isinstance(adapter, KafkaAdapter)
    try:
        assert adapter.partitions() == ["0", "1", "2"]
    finally:
        adapter.close()


def test_earliest_and_latest_are_exact_with_single_record_batches(kafka_broker, topic):
    name = topic(partitions=2)
    adapter = KafkaAdapter(_source(kafka_broker, name))
    try:
        assert adapter.earliest() == {"0": 0, "1": 0}
        assert adapter.latest() == {"0": 0, "1": 0}
        records = devservices.make_records(40)
        ends = devservices.produce_kafka(
            kafka_broker.bootstrap,
            name,
            records,
            partition_of=lambda key, value: int(key[-1:]) % 2,
            one_record_per_batch=True,
        )
        assert ends == {0: 20, 1: 20}
        assert adapter.earliest() == {"0": 0, "1": 0}
        assert adapter.latest() == {"0": 20, "1": 20}
    finally:
        adapter.close()


def test_offsets_for_time(kafka_broker, topic):
    name = topic(partitions=2)
    # partition 0: 10 records one second apart; partition 1: empty
    records = [(f"k{i}", b"v%d" % i, T0 + i * 1000) for i in range(10)]
    ends = devservices.produce_kafka(
        kafka_broker.bootstrap, name, records, partition_of=lambda k, v: 0
    )
    assert ends == {0: 10}
    adapter = KafkaAdapter(_source(kafka_broker, name))
    try:
        assert adapter.offsets_for_time(T0 - 5000) == {"0": 0, "1": 0}
        assert adapter.offsets_for_time(T0) == {"0": 0, "1": 0}
        assert adapter.offsets_for_time(T0 + 2500) == {"0": 3, "1": 0}
        assert adapter.offsets_for_time(T0 + 9000) == {"0": 9, "1": 0}
        assert adapter.offsets_for_time(T0 + 60_000) == {"0": 10, "1": 0}
    finally:
        adapter.close()


def test_offsets_for_time_with_multi_record_batches(kafka_broker, topic):
    """Tansu's latest is short after a multi-record batch; the search still finds the end."""
    name = topic(partitions=1)
    records = [(f"k{i}", b"v%d" % i, T0 + i * 1000) for i in range(50)]
    devservices.produce_kafka(
        kafka_broker.bootstrap, name, records[:49], partition_of=lambda k, v: 0
    )
    devservices.produce_kafka(
        kafka_broker.bootstrap,
        name,
        records[49:],
        partition_of=lambda k, v: 0,
        config={"linger.ms": 200},
    )
    adapter = KafkaAdapter(_source(kafka_broker, name))
    try:
        assert adapter.offsets_for_time(T0 + 31_500) == {"0": 32}
        assert adapter.offsets_for_time(T0 + 49_000) == {"0": 49}
        assert adapter.offsets_for_time(T0 + 99_000) == {"0": 50}
    finally:
        adapter.close()


@pytest.mark.parametrize("one_record_per_batch", [False, True], ids=["bulk", "single"])
def test_sub_ranges_deliver_every_record_exactly_once(kafka_broker, topic, one_record_per_batch):
    name = topic(partitions=3)
    n = 3000 if not one_record_per_batch else 300
    records = devservices.make_records(n)
    ends = devservices.produce_kafka(
        kafka_broker.bootstrap, name, records, one_record_per_batch=one_record_per_batch
    )
    assert sum(ends.values()) == n
    source = _source(kafka_broker, name)
    ranges = [r for p, end in ends.items() for r in _split(str(p), 0, end, 4)]
    table = _read_all(source, ranges, max_batch_rows=97)

    counts = collections.Counter(table.column("key").to_pylist())
    expected = {key.encode() for key, _ in records}
    assert set(counts) == expected, "missing or unexpected keys"
    assert max(counts.values()) == 1, "duplicated keys"
    assert table.num_rows == n
    # offsets: contiguous per partition, values and keys kept together
    by_part = collections.defaultdict(list)
    for row in table.select(["partition", "offset"]).to_pylist():
        by_part[row["partition"]].append(row["offset"])
    for p, offsets in by_part.items():
        assert offsets == list(range(ends[int(p)]))
    values = dict(records)
    for row in table.slice(0, 50).to_pylist():
        assert values[row["key"].decode()] == row["value"]
        assert row["stream_time"] is not None


def test_reads_exactly_the_range_whatever_latest_said(kafka_broker, topic):
    """A bulk batch makes Tansu's latest short; a range to it reads exactly that far."""
    name = topic(partitions=1)
    devservices.produce_kafka(
        kafka_broker.bootstrap,
        name,
        [(f"k{i}", b"v") for i in range(100)],
        partition_of=lambda k, v: 0,
        config={"linger.ms": 200},
    )
    # the final single-record batch went after a 99-record batch
    adapter = KafkaAdapter(_source(kafka_broker, name))
    try:
        latest = adapter.latest()["0"]
    finally:
        adapter.close()
    assert latest == 100
    source = _source(kafka_broker, name)
    # an end in the middle of a stored batch
    table = _read_all(source, [PartitionRange("0", 10, 57)], max_batch_rows=8)
    assert table.column("offset").to_pylist() == list(range(10, 57))
    assert table.column("key").to_pylist() == [f"k{i}".encode() for i in range(10, 57)]


def test_stream_time_is_the_record_timestamp(kafka_broker, topic):
    name = topic(partitions=1)
    devservices.produce_kafka(
        kafka_broker.bootstrap,
        name,
        [("a", b"1", T0), ("b", b"2", T0 + 1)],
        partition_of=lambda k, v: 0,
    )
    table = _read_all(_source(kafka_broker, name), [PartitionRange("0", 0, 2)], 10)
    stamps = table.column("stream_time").cast(pa.int64()).to_pylist()
    assert stamps == [T0, T0 + 1]
    assert table.column("partition").to_pylist() == ["0", "0"]


def test_reading_beyond_latest_raises_retryable_within_the_timeout(kafka_broker, topic):
    name = topic(partitions=1)
    devservices.produce_kafka(
        kafka_broker.bootstrap, name, devservices.make_records(5), partition_of=lambda k, v: 0
    )
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=2)
    for rng in (PartitionRange("0", 0, 8), PartitionRange("0", 7, 9)):
        started = time.monotonic()
        got = []
        with pytest.raises(RetryableError, match="not available"):
            for batch in reader.read(rng, max_batch_rows=2):
                got.extend(batch.column("offset").to_pylist())
        assert time.monotonic() - started < 8
        assert all(rng.start <= o < rng.end for o in got)


def test_empty_range_reads_nothing(kafka_broker, topic):
    name = topic(partitions=1)
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=2)
    assert list(reader.read(PartitionRange("0", 5, 5))) == []


def test_missing_topic_is_permanent(kafka_broker):
    adapter = KafkaAdapter(_source(kafka_broker, "no-such-topic-xyz"))
    try:
        with pytest.raises(PermanentError) as err:
            adapter.partitions()
        assert str(err.value) == (
            f"topic 'no-such-topic-xyz' does not exist on {kafka_broker.bootstrap}"
        )
        with pytest.raises(PermanentError, match="does not exist"):
            adapter.latest()
    finally:
        adapter.close()


def test_unreachable_broker_is_retryable_and_quick():
    port = devservices.free_port()
    source = KafkaSource(bootstrap_servers=f"127.0.0.1:{port}", topic="t")
    adapter = KafkaAdapter(source, timeout=2)
    started = time.monotonic()
    with pytest.raises(RetryableError) as err:
        adapter.partitions()
    assert time.monotonic() - started < 6
    assert f"127.0.0.1:{port}" in str(err.value)
    assert "bootstrapServers" in str(err.value)
    adapter.close()

    started = time.monotonic()
    with pytest.raises(RetryableError):
        list(KafkaRangeReader(source, timeout=2).read(PartitionRange("0", 0, 10)))
    assert time.monotonic() - started < 8


def test_consumer_properties_references_are_resolved(monkeypatch, kafka_broker, topic, grant_secrets):
    grant_secrets(None, ["RCT_CLIENT_ID"])
    monkeypatch.setenv("RCT_CLIENT_ID", "resolved-client-id")
    name = topic(partitions=1)
    source = _source(kafka_broker, name, **{"client.id": "${env:RCT_CLIENT_ID}"})
    conf = consumer_config(source)
    assert conf["client.id"] == "resolved-client-id"
    # settings the reader depends on cannot be overridden
    forced = consumer_config(_source(kafka_broker, name, **{"enable.auto.commit": True}))
    assert forced["enable.auto.commit"] is False
    adapter = KafkaAdapter(source)
    try:
        assert adapter.partitions() == ["0"]
    finally:
        adapter.close()


def test_secret_never_appears_in_errors(monkeypatch, kafka_broker, topic, grant_secrets):
    grant_secrets(None, ["RCT_KAFKA_PW"])
    secret = "s3cr3t-Pa55word-42"
    monkeypatch.setenv("RCT_KAFKA_PW", secret)
    name = topic(partitions=1)
    # an invalid value for a property, holding the secret: librdkafka quotes it
    bad = _source(kafka_broker, name, **{"security.protocol": "${env:RCT_KAFKA_PW}"})
    with pytest.raises(PermanentError) as err:
        KafkaAdapter(bad).partitions()
    assert secret not in str(err.value)
    assert "consumerProperties" in str(err.value)


def test_unknown_consumer_property_is_permanent(kafka_broker, topic):
    name = topic(partitions=1)
    with pytest.raises(PermanentError, match="consumerProperties"):
        KafkaAdapter(_source(kafka_broker, name, **{"no.such.property": "1"})).partitions()


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_offset_gaps_from_transaction_markers_end_the_range(kafka_broker, topic, isolation):
    """A commit marker takes an offset no record has: the reader must not wait for it."""
    from confluent_kafka import Producer

    name = topic(partitions=1)
    producer = Producer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "transactional.id": f"tx-{name}",
            "batch.num.messages": 1,
            "linger.ms": 0,
        }
    )
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(name, key=b"k%d" % i, value=b"v", partition=0)
    producer.commit_transaction(10)
    source = _source(kafka_broker, name, **{"isolation.level": isolation})
    adapter = KafkaAdapter(source)
    try:
        end = adapter.latest()["0"]
    finally:
        adapter.close()
    assert end == 6  # offsets 0..4, then the commit marker at 5
    reader = KafkaRangeReader(source, timeout=5)
    started = time.monotonic()
    offsets = [o for b in reader.read(PartitionRange("0", 0, end)) for o in b["offset"].to_pylist()]
    assert offsets == [0, 1, 2, 3, 4]
    assert time.monotonic() - started < 4, "waited for the marker's offset"


def test_sub_ranges_cut_at_transaction_markers_read_every_record_once(kafka_broker, topic):
    """A batch's range split for several tasks (``split_ranges``) may start or end on a commit
    marker's offset, or hold nothing but one: each sub-range still ends without waiting for
    the marker, and together they deliver every record once."""
    from confluent_kafka import Producer

    from reconciler.pipeline.sources import split_ranges

    name = topic(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"tx-{name}",
                         "batch.num.messages": 1, "linger.ms": 0})
    producer.init_transactions(10)
    for t in range(4):  # offsets 5t..5t+3 hold records, 5t+4 the commit marker
        producer.begin_transaction()
        for i in range(4):
            producer.produce(name, key=b"k%d-%d" % (t, i), value=b"v", partition=0)
        producer.commit_transaction(10)
    source = _source(kafka_broker, name)
    adapter = KafkaAdapter(source)
    try:
        end = adapter.latest()["0"]
    finally:
        adapter.close()
    assert end == 20  # the range ends in a gap: its last offset is a marker
    records = [o for o in range(end) if o % 5 != 4]
    reader = KafkaRangeReader(source, timeout=5)
    for tasks in (2, 3, 4, 5, 20):  # cuts at 10 (just past a marker), 4 and 9 (on markers), ...
        groups = split_ranges([PartitionRange("0", 0, end)], tasks)
        cuts = [sub.start for group in groups for sub in group]
        started = time.monotonic()
        got = [o for group in groups for sub in group for b in reader.read(sub) for o in b["offset"].to_pylist()]
        assert sorted(got) == records, (tasks, cuts)
        assert time.monotonic() - started < 4 + tasks * 0.2, f"waited for a marker's offset ({tasks} tasks)"


class _FakeWatermarks:
    def __init__(self, low: int, high: int):
        self.marks = (low, high)

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        return self.marks


def test_offsets_deleted_by_retention_are_permanent_and_name_the_first_offset():
    """Tansu cannot delete records, so the retention answer is checked on its own."""
    reader = KafkaRangeReader(KafkaSource("127.0.0.1:1", "clicks"))
    err = reader._out_of_range(_FakeWatermarks(500, 900), 3, "clicks/3", 100, 700)
    assert isinstance(err, PermanentError)
    assert "clicks/3" in str(err) and "first available offset is 500" in str(err)
    err = reader._out_of_range(_FakeWatermarks(0, 90), 3, "clicks/3", 100, 700)
    assert isinstance(err, RetryableError)
    err = reader._unavailable(_FakeWatermarks(500, 900), 3, "clicks/3", 100, 700, None, [])
    assert isinstance(err, PermanentError) and "500" in str(err)


def test_a_range_the_broker_holds_but_does_not_deliver_is_called_slow_not_unserved():
    """Seen in an hour-long run on an overloaded machine: the high watermark was past the
    range's end, and the error said the end was not served yet."""
    reader = KafkaRangeReader(KafkaSource("127.0.0.1:1", "clicks"), timeout=10)
    err = reader._unavailable(_FakeWatermarks(0, 108444), 0, "clicks/0", 101881, 102126, None, [])
    assert isinstance(err, RetryableError)
    assert "on the broker (high watermark 108444)" in str(err) and "slow" in str(err)
    assert "does not serve yet" not in str(err)
    err = reader._unavailable(_FakeWatermarks(0, 102000), 0, "clicks/0", 101881, 102126, None, [])
    assert isinstance(err, RetryableError) and "does not serve yet" in str(err)


def test_a_starved_broker_that_answers_short_fetches_with_nothing_is_asked_with_longer_waits(
        kafka_broker, topic, monkeypatch, caplog):
    """Seen in an hour-long daemon run at load 6: Tansu answered every fetch whose wait was
    100 ms with nothing while its high watermark was far past the position, and one batch
    was retried for 20 minutes (a consumer with a 500 ms wait read the same offset in 2 s).
    Here the real broker serves the records, and the client in front of it drops what a
    fetch with a wait under 500 ms would have brought: the reader must ask again with a
    longer wait, and still deliver every offset once. The first wait is short (20 ms: Tansu
    holds a fetch for its whole wait while a partition has nothing new), so its stall is
    asked about sooner, and raised at INFO."""
    import reconciler.streams.kafka.config as kafka_config

    name = topic(partitions=1)
    devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(60),
                              partition_of=lambda k, v: 0)
    real = kafka_config.Consumer
    waits: list[int] = []

    class Starved:
        def __init__(self, conf):
            self.wait = int(conf.get("fetch.wait.max.ms", 500))
            waits.append(self.wait)
            self.client = real(conf)

        def consume(self, num_messages=1, timeout=-1):
            if self.wait < 500:
                time.sleep(min(timeout, 0.5))
                return []
            return self.client.consume(num_messages=num_messages, timeout=timeout)

        def __getattr__(self, attr):
            return getattr(self.client, attr)

    monkeypatch.setattr(kafka_config, "Consumer", Starved)
    reader = KafkaRangeReader(_source(kafka_broker, name), timeout=8)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="reconciler.streams.kafka.reader"):
        offsets = [o for rng in (PartitionRange("0", 0, 30), PartitionRange("0", 30, 60))
                   for b in reader.read(rng, max_batch_rows=7) for o in b.column("offset").to_pylist()]
    assert offsets == list(range(60))
    assert waits == [20, 100, 500, 500]  # raised twice, then kept for the next range
    # and for the process's next reads of the topic (a Spark worker's next tasks)
    assert KafkaRangeReader(_source(kafka_broker, name), timeout=8)._fetch_wait == 500
    assert "asking again with fetch.wait.max.ms=500" in caplog.text
    assert time.monotonic() - started < 8


def test_an_unreachable_broker_fails_a_read_within_its_timeout_not_twice_it():
    """Found in review of the longer fetch waits: nothing listens on the port, and the stall
    asked for the high watermark with the whole timeout, then again at the next empty poll,
    so "cannot reach ... within 4s" came after ~10.5 s. The stall asks once, within what is
    left of the timeout, and never of a broker that cannot be reached."""
    timeout = 4.0
    source = KafkaSource(bootstrap_servers=f"127.0.0.1:{devservices.free_port()}", topic="t")
    reader = KafkaRangeReader(source, timeout=timeout)
    started = time.monotonic()
    with pytest.raises(RetryableError, match="cannot reach"):
        list(reader.read(PartitionRange("0", 0, 10)))
    elapsed = time.monotonic() - started
    assert elapsed < timeout + 2, f"unreachable broker reported after {elapsed:.1f}s (timeout {timeout:g}s)"



def test_the_first_fetch_wait_is_short_unless_the_spec_sets_one():
    from reconciler.streams.kafka import reader as reader_mod

    plain = KafkaSource(bootstrap_servers="127.0.0.1:1", topic="first-wait")
    assert KafkaRangeReader(plain)._fetch_wait == reader_mod.FIRST_FETCH_WAIT_MS
    chosen = KafkaSource(bootstrap_servers="127.0.0.1:1", topic="first-wait",
                         consumer_properties={"fetch.wait.max.ms": 300})
    assert KafkaRangeReader(chosen)._fetch_wait is None  # the spec's 300 ms, until a stall raises it
