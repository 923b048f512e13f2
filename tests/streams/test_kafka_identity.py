"""The topic id and the offset probe against a real broker (Tansu), issue 41 item 11.

Tansu under-reports a partition's end when a batch holds several records: a checkpoint above
the reported end with the record still there must not read as truncation. A topic deleted and
created again gets a new id, and no longer holds the offsets beyond its new end.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from reconciler.errors import RetryableError
from reconciler.model import KafkaSource
from reconciler.runtime import fingerprint, truncation
from reconciler.streams.kafka import KafkaAdapter


def _bulk(bootstrap: str, topic: str, per_partition: int, partitions: int) -> None:
    """Many records per batch (no closing single-record batch): Tansu under-reports the end."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200, "log_level": 2})
    for i in range(per_partition * partitions):
        p.produce(topic, key=f"k{i}".encode(), value=b"{}", partition=i % partitions)
    assert p.flush(30) == 0


def test_under_reported_end_is_not_truncation_and_recreation_is(kafka_broker, topic):
    name = topic(partitions=2)
    _bulk(kafka_broker.bootstrap, name, 15, 2)
    adapter = KafkaAdapter(KafkaSource(bootstrap_servers=kafka_broker.bootstrap, topic=name))
    try:
        latest = adapter.latest()
        checkpoint = {"0": 15, "1": 15}
        assert all(latest[p] < 15 for p in latest), f"Tansu no longer under-reports its end: {latest}"
        first = adapter.identity()
        assert first and first == adapter.identity()
        assert adapter.holds("0", 14) and adapter.holds("1", 14)
        assert truncation.detect(adapter, checkpoint, latest, first) == (first, None)

        kafka_broker.delete_topic(name, timeout=10)
        kafka_broker.create_topic(name, 2)
        _bulk(kafka_broker.bootstrap, name, 5, 2)
        adapter.close()
        assert adapter.identity() not in (None, first)
        assert not adapter.holds("0", 14)
        # without the id (a broker that gives none), the probe alone finds it
        latest = adapter.latest()
        assert truncation.suspects(checkpoint, latest) == {"0": 14, "1": 14}
        _, found = truncation.detect(_NoId(adapter), checkpoint, latest, None)
        assert dict(found.moves) == {"0": (15, 0), "1": (15, 0)}
        # once an id is recorded for the generation, no id is a lookup that failed, not "no ids"
        with pytest.raises(RetryableError, match="gave no id"):
            truncation.detect(_NoId(adapter), checkpoint, latest, first)
    finally:
        adapter.close()


class _NoId:
    def __init__(self, adapter):
        self._adapter = adapter

    def identity(self):
        return None

    def __getattr__(self, name):
        return getattr(self._adapter, name)


def test_the_fingerprint_tells_a_recreated_topic_with_more_records_from_the_old_one(kafka_broker, topic):
    """No id needed: the record at an offset already ingested has another timestamp, or is gone."""
    name = topic(partitions=2)
    _bulk(kafka_broker.bootstrap, name, 15, 2)
    adapter = KafkaAdapter(KafkaSource(bootstrap_servers=kafka_broker.bootstrap, topic=name))
    try:
        old = adapter.records_at({"0": 14, "1": 14})
        assert {p: m[0] for p, m in old.items()} == {"0": 14, "1": 14}
        assert adapter.records_at({"0": 14, "1": 14}) == old  # the same records: the same answer
        assert fingerprint.replaced(old, old) == []

        kafka_broker.delete_topic(name, timeout=10)
        kafka_broker.create_topic(name, 2)
        time.sleep(0.01)  # another millisecond, whatever the clock
        _bulk(kafka_broker.bootstrap, name, 20, 1)  # more records than the checkpoint, all in partition 0
        adapter.close()
        now = adapter.records_at({"0": 14, "1": 14})
        assert now["0"][0] == 14 and now["0"][1] != old["0"][1]
        assert now["1"] is None  # partition 1 is empty now
        assert sorted(fingerprint.replaced(old, now)) == ["0", "1"]
    finally:
        adapter.close()

