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

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from reconciler.errors import RetryableError
from reconciler.streams.kafka.config import (
    EOF,
    OFFSET_RESET,
    OUT_OF_RANGE,
    UNREACHABLE,
    ClientConfig,
)

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


# Answers that mean "this broker gives no topic ids" (older than Kafka 2.8, or a DescribeTopics
# it does not implement). Any other failure is a lookup that failed: unreadable is not "no id".
_NO_IDS = {KafkaError.UNSUPPORTED_VERSION, KafkaError.INVALID_REQUEST,
           getattr(KafkaError, "_UNSUPPORTED_FEATURE", -165)}


def topic_id(admin: AdminClient, config: ClientConfig, topic: str, timeout: float) -> str | None:
    """The topic's id as text, or None when the broker gives none (before Kafka 2.8, an
    all-zero id, or a DescribeTopics it does not implement): the probe and the fingerprint
    are then the only signs. A lookup that fails (no answer in time, a transport error)
    raises ``RetryableError``: the step fails as lost contact and reads nothing."""
    doing = f"asking the id of topic {topic!r}"
    try:
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic].result(timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is not None and err.code() in _NO_IDS:
            log.debug("no topic id for %s: %s", topic, config.scrub(str(exc)))
            return None
        raise config.translate(exc, doing) from None
    except (ValueError, TypeError, NotImplementedError) as exc:  # a client that cannot send the request
        log.debug("no topic id for %s: %s", topic, config.scrub(str(exc)))
        return None
    except TimeoutError:  # concurrent.futures' (the builtin since 3.11): the broker did not answer
        raise RetryableError(f"{doing}: Kafka at {config.source.bootstrap_servers} did not answer within "
                             f"{timeout:g}s") from None
    uid = getattr(described, "topic_id", None)
    if uid is None or (uid.get_most_significant_bits() == 0 and uid.get_least_significant_bits() == 0):
        return None
    return str(uid)


def holds(config: ClientConfig, topic: str, partition: int, offset: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the partition still holds a record at ``offset`` or after it.

    False only on the broker's word: the offset out of range, the partition's end reached
    before it, or nothing sent for ``timeout`` (Tansu's answer beyond a partition's end) while
    the same broker, asked again, reports the partition's end at or below the offset. A broker
    that cannot be reached, or answers too slowly to tell, raises ``RetryableError``:
    unreadable is not gone, and a rewind on a slow answer would read every record again."""
    consumer, errors = config.consumer_with_errors(**{"fetch.max.bytes": 1 << 20, "fetch.wait.max.ms": 500})
    where = f"{topic}/{partition}"
    doing = f"probing offset {offset} of {where}"
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
                raise config.translate(KafkaException(err), doing)
        if any(e.code() in UNREACHABLE for e in errors):
            raise RetryableError(f"{doing}: Kafka at {config.source.bootstrap_servers} did not answer within "
                                 f"{timeout:g}s")
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout, cached=False)
        if high > offset:  # it says it holds the offset, and sent nothing: too slow to tell
            raise RetryableError(f"{doing}: Kafka at {config.source.bootstrap_servers} reports the partition "
                                 f"ends at {high} but sent no record within {timeout:g}s")
        return False
    except KafkaException as exc:
        raise config.translate(exc, doing) from None
    finally:
        try:
            consumer.close()
        except (KafkaException, RuntimeError):
            pass


def record_at(config: ClientConfig, topic: str, partition: int, offset: int,
              timeout: float = PROBE_TIMEOUT) -> tuple[int, int] | None:
    """``(offset, timestamp ms)`` of the first record at or after ``offset``: the fingerprint of
    a record already ingested (``runtime.fingerprint``). None when the partition no longer
    holds it (``holds`` says so on the broker's word): truncated, or below the log start
    (OFFSET_OUT_OF_RANGE), which retention may have moved since the caller read it; the
    caller reads the earliest offsets again before calling it replaced. An unanswered fetch raises
    ``RetryableError``. The offset answered tells a record compacted away (a later offset:
    no conclusion) from a different record at the same offset (another timestamp)."""
    consumer, _errors = config.consumer_with_errors(**{"fetch.max.bytes": 1 << 20, "fetch.wait.max.ms": 500,
                                                       "max.partition.fetch.bytes": 64 << 10})
    doing = f"reading the record at offset {offset} of {topic}/{partition}"
    ended = False
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeout
        while not ended and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1, timeout=0.5):
                err = m.error()
                if err is None and m.offset() >= offset:
                    kind, stamp = m.timestamp()
                    return int(m.offset()), int(stamp) if kind != TIMESTAMP_NOT_AVAILABLE else -1
                if err is not None and err.code() in (EOF, OUT_OF_RANGE, OFFSET_RESET):
                    ended = True
                elif err is not None:
                    raise config.translate(KafkaException(err), doing)
    except KafkaException as exc:
        raise config.translate(exc, doing) from None
    finally:
        try:
            consumer.close()
        except (KafkaException, RuntimeError):
            pass
    if ended or not holds(config, topic, partition, offset, timeout):
        return None
    raise RetryableError(f"{doing}: Kafka at {config.source.bootstrap_servers} holds it but sent nothing within "
                         f"{timeout:g}s")
