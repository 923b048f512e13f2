"""Messages as real applications publish them (issue 10 item 5), ingested exactly once with
``__key`` right, on the real brokers:

* Kafka: keyed records with headers and some null values (tombstones), in batches
  compressed with gzip, snappy, lz4 and zstd; a transactional producer with a committed,
  an aborted and another committed transaction (control records leave offset gaps).
* RabbitMQ: messages published through AMQP 0.9.1 with pika into a stream, the way most
  applications write into streams (the broker converts body and properties), beside
  messages published through the stream protocol.

Tansu does not filter aborted records for read_committed consumers (see DESIGN's Notes),
so the transactional test asserts the committed records and the gaps only.
"""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from pyspark.sql import functions as F

import devservices
from tests.e2e import helpers as h

CODECS = ("gzip", "snappy", "lz4", "zstd")


def _value(i: int) -> bytes:
    return json.dumps({"id": f"k{i:06d}", "ts": devservices.DEFAULT_TS_START_MS + i * 10, "user": f"u{i % 7}",
                       "page": f"/p{i % 5}", "bytes": 100 + i}).encode()


def _produce(bootstrap: str, conf: dict, sends) -> list[tuple[int, int, str, bool]]:
    """Send (partition, key, value or None, headers); returns (partition, offset, key, is_null)."""
    got: list[tuple[int, int, str, bool]] = []
    errors: list = []

    def done(err, msg):
        if err is not None:
            errors.append(err)
        else:
            got.append((msg.partition(), msg.offset(), msg.key().decode(), msg.value() is None))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 200, **conf})
    for partition, key, value, headers in sends:
        producer.produce(sends.topic, key=key, value=value, partition=partition, headers=headers, on_delivery=done)
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors
    return got


class _Sends(list):
    def __init__(self, topic: str):
        super().__init__()
        self.topic = topic


@pytest.mark.integration
@pytest.mark.kafka
@pytest.mark.spark
def test_kafka_keys_headers_tombstones_and_every_compression(tmp_path, kafka_broker, topic, spark):
    name = topic(partitions=len(CODECS))
    delivered: list[tuple[int, int, str, bool]] = []
    i = 0
    for partition, codec in enumerate(CODECS):
        sends = _Sends(name)
        for _ in range(400):
            key = f"k{i:06d}".encode()
            value = None if i % 10 == 3 else _value(i)
            sends.append((partition, key, value, [("trace-id", f"t{i}".encode()), ("codec", codec.encode())]))
            i += 1
        delivered += _produce(kafka_broker.bootstrap, {"compression.type": codec}, sends)
    # one single-record batch per partition: Tansu's latest offset is then exact
    tail = _Sends(name)
    for partition in range(len(CODECS)):
        tail.append((partition, f"k{i:06d}".encode(), _value(i), None))
        i += 1
    delivered += _produce(kafka_broker.bootstrap, {"linger.ms": 0}, tail)

    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("real", h.kafka_source(kafka_broker.bootstrap, name), task_count=2))
    code, _ = h.run_daemon(s, timeout=240)
    assert code == 0

    values = [k for _, _, k, null in delivered if not null]
    h.assert_exactly_once(h.key_counts(spark, s, "real"), values)
    df = h.read_segments(spark, s, "real")
    assert df.where(F.col("id") != F.col("__key")).count() == 0  # the Kafka key is __key
    # every tombstone is accounted for once, as a dead letter at its exact position
    tombstones = sorted((str(p), o) for p, o, _, null in delivered if null)
    assert [(p, o) for p, o, _ in h.deadletters(spark, s, "real")] == tombstones


@pytest.mark.integration
@pytest.mark.kafka
@pytest.mark.spark
def test_kafka_transactions_committed_records_once_control_records_are_gaps(tmp_path, kafka_broker, topic, spark):
    name = topic(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"tx-{name}"})
    producer.init_transactions(30)
    committed, offsets = [], []

    def send(start: int, n: int) -> list[str]:
        keys = []
        for j in range(start, start + n):
            key = f"k{j:06d}"
            producer.produce(name, key=key.encode(), value=_value(j), partition=0,
                             on_delivery=lambda err, msg: offsets.append(msg.offset()) if err is None else None)
            keys.append(key)
        return keys

    producer.begin_transaction()
    committed += send(0, 100)
    producer.commit_transaction(30)
    producer.begin_transaction()
    send(100, 50)
    producer.abort_transaction(30)
    producer.begin_transaction()
    committed += send(150, 100)
    producer.commit_transaction(30)
    producer.flush(30)

    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("txn", h.kafka_source(kafka_broker.bootstrap, name)))
    code, _ = h.run_daemon(s, timeout=240)
    assert code == 0
    counts = h.key_counts(spark, s, "txn")
    for key in committed:
        assert counts[key] == 1, key
    assert all(n == 1 for n in counts.values())
    # the control records are offsets no record sits at: the checkpoint passed them
    end = h.cli_json(s, "status", "txn", "--no-lag")["supervisors"][0]["partitions"][0]["checkpoint"]
    assert end > max(offsets), (end, max(offsets))
    got_offsets = {r["__offset"] for r in h.read_segments(spark, s, "txn").select("__offset").collect()}
    # below the end: the first commit's and the abort's control records (librdkafka purged the
    # aborted records before sending them; the last commit's marker is the partition's end)
    assert len(set(range(end)) - got_offsets) >= 2


@pytest.mark.integration
@pytest.mark.rabbitmq
@pytest.mark.spark
def test_rabbitmq_messages_published_with_pika_and_the_stream_protocol(tmp_path, rabbit_node, stream, spark):
    import pika

    name = stream()
    records = devservices.make_records(600)
    amqp, native = records[:400], records[400:]
    conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=rabbit_node.amqp_port,
                                                             credentials=pika.PlainCredentials("guest", "guest")))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for key, value in amqp:
            ch.basic_publish(exchange="", routing_key=name, body=value,
                             properties=pika.BasicProperties(message_id=key, content_type="application/json",
                                                             headers={"source": "pika"}, delivery_mode=2))
    finally:
        conn.close()
    assert devservices.produce_rabbit(rabbit_node.stream_uri, name, native) == len(native)

    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("pika", h.rabbit_source(rabbit_node.stream_uri, [name])))
    code, _ = h.run_daemon(s, timeout=240)
    assert code == 0
    h.assert_exactly_once(h.key_counts(spark, s, "pika"), h.keys(records))
    df = h.read_segments(spark, s, "pika")
    assert df.where(F.col("id") != F.col("__key")).count() == 0  # AMQP 0.9.1 message_id is the key
