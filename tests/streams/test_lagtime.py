"""Lag in time (issue 32): the broker's timestamp of the record at the checkpoint, from a real
Tansu broker and a real RabbitMQ node, one fetch per partition that is behind, bounded when
the broker is slow or gone.
"""

from __future__ import annotations

import time

import pytest

import devservices
from reconciler.errors import ReconcilerError
from reconciler.model import KafkaSource, RabbitSource
from reconciler.streams import adapter_for
from reconciler.streams.lagtime import behind, lag_seconds, max_seconds, record_times

T0 = 1_700_000_000_000


def test_lag_seconds_per_partition():
    now = T0 + 90_000
    got = lag_seconds({"0": 5, "1": 9, "2": 3, "3": 0}, {"0": 9, "1": 9, "2": 7, "3": 4, "4": 1},
                      {"0": T0, "2": None}, now)
    # behind with a time: its age; caught up: 0; the partition ends there: 0; not known: None
    assert got == {"0": 90.0, "1": 0.0, "2": 0.0, "3": None, "4": None}
    assert max_seconds({"0": 90.0, "1": 0.0}) == 90.0
    assert max_seconds({"0": 90.0, "1": None}) is None  # never a false number
    assert max_seconds({}) == 0.0
    assert lag_seconds({"0": 1}, {"0": 2}, {"0": now + 5_000}, now) == {"0": 0.0}  # clocks apart: never negative
    assert behind({"0": 5, "1": 9, "2": 1}, {"0": 9, "1": 9}) == {"0": 5}


@pytest.mark.kafka
@pytest.mark.integration
def test_kafka_record_times_at_the_checkpoint(kafka_broker, topic):
    name = topic(partitions=2)
    records = [(f"k{i}", b"{}", T0 + i * 1000) for i in range(40)]
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    source = KafkaSource(bootstrap_servers=kafka_broker.bootstrap, topic=name)
    adapter = adapter_for(source, timeout=5.0)
    try:
        sent = {}  # partition -> [timestamps in offset order]
        import zlib
        for k, _, ts in records:
            sent.setdefault(str(zlib.crc32(k.encode()) % 2), []).append(ts)
        checkpoint = {"0": 3, "1": len(sent["1"])}  # partition 1 caught up
        latest = {str(p): e for p, e in ends.items()}
        times = record_times(adapter, checkpoint, latest)
        assert times == {"0": sent["0"][3]}  # only the partition behind is asked
        assert adapter.record_times({"0": 0, "1": 2}) == {"0": sent["0"][0], "1": sent["1"][2]}
        assert adapter.record_times({"1": ends[1]}) == {"1": None}  # the partition ends there
        lag = lag_seconds(checkpoint, latest, times, sent["0"][3] + 61_000)
        assert lag == {"0": 61.0, "1": 0.0}
    finally:
        adapter.close()


@pytest.mark.kafka
@pytest.mark.integration
def test_kafka_record_times_are_bounded_when_the_broker_is_gone():
    port = devservices.free_port()
    adapter = adapter_for(KafkaSource(bootstrap_servers=f"127.0.0.1:{port}", topic="t"), timeout=1.0)
    started = time.monotonic()
    try:
        try:
            got = adapter.record_times({"0": 5})
        except ReconcilerError:
            got = None
        assert not got  # nothing known, never a number
    finally:
        adapter.close()
    assert time.monotonic() - started < 15  # bounded by the timeout, not by the broker


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_rabbit_record_times_are_chunk_times(rabbit_node, stream):
    a, b = stream(), stream()
    before = int(time.time() * 1000)
    devservices.produce_rabbit(rabbit_node.stream_uri, a, [(f"k{i}", b"{}") for i in range(30)])
    after = int(time.time() * 1000)
    adapter = adapter_for(RabbitSource(uri=rabbit_node.stream_uri, streams=(a, b)), timeout=5.0)
    latest = adapter.latest()
    times = record_times(adapter, {a: 0, b: 0}, latest)
    assert set(times) == {a}  # b is empty: caught up, not asked
    assert before - 2000 <= times[a] <= after + 2000  # the broker's clock, the chunk's time
    assert adapter.record_times({a: latest[a], b: 0}) == {a: None, b: None}  # nothing at the end
    lag = lag_seconds({a: 0, b: 0}, latest, times, times[a] + 5_000)
    assert lag == {a: 5.0, b: 0.0}
