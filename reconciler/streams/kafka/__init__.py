"""Kafka partitions, positions and range reads with confluent-kafka (librdkafka): ``config``
(the client and its errors), ``adapter`` (positions), ``reader`` (ranges), ``columns`` (delivered
messages into Arrow, in bulk), ``times``
(the timestamp of the record at an offset).

``KafkaAdapter`` answers positions (``partitions``, ``earliest``, ``latest``,
``offsets_for_time``); ``KafkaRangeReader`` reads exactly the records with offsets in
``[start, end)`` of one partition as ``RECORD_SCHEMA`` Arrow batches.

Both build their client configuration the same way: bootstrap servers, short
timeouts, then the spec's ``consumerProperties`` with ``${env:..}`` / ``${file:..}``
references resolved just before the client is built (so SASL and TLS need nothing
but configuration), then the settings this module depends on (no group commits,
partition EOF events). A Kafka consumer group is never joined and no offset is ever
committed to Kafka: the checkpoint lives only in the metadata database.

Exactly once does not trust what a broker says the end is: the reader reads exactly
``[start, end)`` by offset, stopping at the record ``end - 1``, or earlier when the
fetch position or the partition's end (an EOF event at ``>= end``) proves that no
record in the range is left (gaps from compaction or transaction markers). Tansu 0.6
answers ``latest`` (ListOffsets and the metadata high watermark) with the last
batch's base offset + 1 when a batch holds several records, and answers every
timestamp lookup with offset 0; ``offsets_for_time`` therefore checks the broker's
answer against the records themselves and searches by reading when it is wrong.

May import: confluent-kafka, pyarrow, numpy, ``reconciler.streams.base``, ``reconciler.spec``
(secret references), ``reconciler.model`` and ``reconciler.errors``; nothing above them.
"""

from reconciler.streams.kafka.adapter import KafkaAdapter
from reconciler.streams.kafka.config import CONSUME_CHUNK, DEFAULT_TIMEOUT, consumer_config
from reconciler.streams.kafka.reader import KafkaRangeReader

__all__ = ["CONSUME_CHUNK", "DEFAULT_TIMEOUT", "KafkaAdapter", "KafkaRangeReader", "consumer_config"]
