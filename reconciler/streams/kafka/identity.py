"""Is this still the topic the checkpoints were taken on? The topic id, and a probe of one offset.

A topic deleted and created again, or a partition truncated by an unclean leader election,
starts its offsets again below the checkpoint; read naively, the new records below the
checkpoint are skipped and the partition looks caught up. Two signs tell it:

* the topic id (Kafka 2.8+, Tansu too), which a re-created topic never shares with the old
  one: proof, even when the new topic already holds more records than the checkpoint;
* the record below the checkpoint (the last one ingested), asked for when the checkpoint is
  above the end the broker reports. A reported end below the checkpoint alone proves
  nothing: Tansu reports the last batch's base offset + 1, below the true end, when a batch
  holds several records. Only a partition that no longer holds that offset was truncated.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from reconciler.errors import RetryableError
from reconciler.streams.kafka.config import EOF, OFFSET_RESET, OUT_OF_RANGE, UNREACHABLE, ClientConfig

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 5.0  # seconds: a broker holding the record sends it at once; a truncated one sends nothing
# Consumer settings an admin client does not take (librdkafka would warn about each).
_CONSUMER_ONLY = ("group.id", "enable.auto.commit", "enable.auto.offset.store", "enable.partition.eof",
                  "auto.offset.reset", "session.timeout.ms", "fetch.queue.backoff.ms", "fetch.wait.max.ms",
                  "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes", "isolation.level",
                  "queued.min.messages", "queued.max.messages.kbytes", "check.crcs")


def admin_client(config: ClientConfig) -> AdminClient:
    """An admin client with the source's connection settings (its consumer settings left out)."""
    return AdminClient({k: v for k, v in config.build().items() if k not in _CONSUMER_ONLY})


def topic_id(admin: AdminClient, config: ClientConfig, topic: str, timeout: float) -> str | None:
    """The topic's id as text, or None when the broker gives none (before Kafka 2.8, an
    all-zero id, or a DescribeTopics the client may not send): the probe is then the only sign."""
    try:
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic].result(timeout)
    except (KafkaException, ValueError, TypeError, NotImplementedError) as exc:
        log.debug("no topic id for %s: %s", topic, config.scrub(str(exc)))
        return None
    uid = getattr(described, "topic_id", None)
    if uid is None or (uid.get_most_significant_bits() == 0 and uid.get_least_significant_bits() == 0):
        return None
    return str(uid)


def holds(config: ClientConfig, topic: str, partition: int, offset: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the partition still holds a record at ``offset`` or after it.

    False when the broker says the offset is out of range, ends the partition before it, or
    sends nothing for ``timeout`` (Tansu's answer beyond a partition's end) while it can be
    reached; a broker that cannot be reached raises ``RetryableError``: unreadable is not gone."""
    consumer, errors = config.consumer_with_errors(**{"fetch.max.bytes": 1 << 20, "fetch.wait.max.ms": 500})
    where = f"{topic}/{partition}"
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1, timeout=0.5):
                err = m.error()
                if err is None:
                    return m.offset() >= offset
                if err.code() in (EOF, OUT_OF_RANGE, OFFSET_RESET):
                    return False
                raise config.translate(KafkaException(err), f"probing offset {offset} of {where}")
        if any(e.code() in UNREACHABLE for e in errors):
            raise RetryableError(f"probing offset {offset} of {where}: Kafka at "
                                 f"{config.source.bootstrap_servers} did not answer within {timeout:g}s")
        return False
    except KafkaException as exc:
        raise config.translate(exc, f"probing offset {offset} of {where}") from None
    finally:
        try:
            consumer.close()
        except (KafkaException, RuntimeError):
            pass
