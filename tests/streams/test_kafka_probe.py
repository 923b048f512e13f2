"""The offset probe and the topic id lookup on a real broker (Tansu), issue 41.11.

``holds(p, o)`` must be True for every offset below the partition's true end: a False there
is a healthy partition read as truncated, which ``onRetentionLoss: continue`` rewinds to the
earliest offset (every record ingested again) and the default turns UNHEALTHY with advice to
rewind (the same duplicates).
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from reconciler.errors import RetryableError
from reconciler.model import KafkaSource
from reconciler.streams.kafka import KafkaAdapter
from reconciler.streams.kafka.config import ClientConfig
from reconciler.streams.kafka.identity import admin_client, topic_id


def _bulk(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200, "log_level": 2})
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=b"{}", partition=0)
    assert p.flush(30) == 0


def test_every_offset_below_the_true_end_is_held(kafka_broker, topic):
    name = topic(partitions=1)
    _bulk(kafka_broker.bootstrap, name, 15)
    adapter = KafkaAdapter(KafkaSource(bootstrap_servers=kafka_broker.bootstrap, topic=name))
    try:
        reported = adapter.latest()["0"]
        assert reported < 15, f"Tansu no longer under-reports its end: {reported}"
        not_held = [o for o in range(15) if not adapter.holds("0", o)]
        assert not_held == [], f"reported end {reported}; offsets below the true end 15 read as not held: {not_held}"
    finally:
        adapter.close()


def test_an_unanswered_describe_topics_is_not_a_broker_without_ids():
    """``topic_id`` turns any failure (a timeout under load, a broker not answering) into None,
    the answer of a broker that gives no ids: the runtime then skips the id comparison for that
    step (tests/runtime/test_recreation_exactly_once.py shows the duplicates that follow). Like
    ``holds``, unreadable must not read as "no id": it must raise RetryableError."""
    source = KafkaSource(bootstrap_servers="127.0.0.1:9", topic="clicks")
    config = ClientConfig(source, 1.0)
    try:
        got = topic_id(admin_client(config), config, "clicks", 1.0)
    except RetryableError:
        return
    except Exception as exc:  # noqa: BLE001 - what escapes instead
        # concurrent.futures.TimeoutError (``result(timeout)`` with the request's own timeout)
        # is not caught by topic_id: the step's catch-all calls it a failed Spark batch
        # (UNHEALTHY_TASKS, with a traceback) instead of LOST_CONTACT_WITH_STREAM
        pytest.fail(f"topic_id raised {type(exc).__module__}.{type(exc).__name__} ({exc!r}), not RetryableError")
    pytest.fail(f"topic_id answered {got!r} for a broker that did not answer (read as a broker without ids)")
