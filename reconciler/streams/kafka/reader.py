"""Exactly the records with offsets in ``[start, end)`` of one Kafka partition, as Arrow batches.

Exactly once does not trust what a broker says the end is: the reader reads exactly
``[start, end)`` by offset, stopping at the record ``end - 1``, or earlier when the fetch
position or the partition's end (an EOF event at ``>= end``) proves that no record in the
range is left (gaps from compaction or transaction markers).
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from reconciler.errors import PermanentError, RetryableError
from reconciler.model import KafkaSource, PartitionRange
from reconciler.streams.kafka.columns import Columns, any_error, offsets_of
from reconciler.streams.kafka.config import (
    CONSUME_CHUNK,
    DEFAULT_TIMEOUT,
    EOF,
    OFFSET_RESET,
    OUT_OF_RANGE,
    UNREACHABLE,
    ClientConfig,
)

log = logging.getLogger(__name__)

# fetch.wait.max.ms, raised step by step when a broker that holds the records sends none
# (``KafkaRangeReader._longer_wait``; kept for the rest of the reader's ranges, which are one
# task's), and the stall that raises it
FETCH_WAITS_MS = (100, 500, 2000)
STALL_SECONDS = 2.0


class KafkaRangeReader:
    """Reads exactly ``[start, end)`` of one partition of a topic as Arrow batches.

    ``timeout`` bounds every wait: no progress for that long (the range is not
    available yet, or the broker went away) raises ``RetryableError``.
    """

    def __init__(self, source: KafkaSource, *, timeout: float = DEFAULT_TIMEOUT):
        self.source = source
        self.timeout = timeout
        self._config = ClientConfig(source, timeout)
        # fetch.wait.max.ms once a stall raised it: kept for this reader's next ranges
        self._fetch_wait: int | None = None

    def _consumer(self) -> tuple[Consumer, deque[KafkaError]]:
        if self._fetch_wait is None:
            return self._config.consumer_with_errors()
        return self._config.consumer_with_errors(**{"fetch.wait.max.ms": self._fetch_wait})

    def _longer_wait(self, consumer: Consumer, partition: int, position: int,
                     errors: deque[KafkaError], budget: float) -> int | None:
        """After a stall: the next ``fetch.wait.max.ms`` to ask with, when the broker holds
        records at ``position`` and the wait may still grow; else None.

        A broker whose lookup of the position outlasts the fetch's wait answers every fetch
        with nothing while its high watermark is far past the position. Tansu's in-memory
        storage lists a partition's stored batches on every fetch (40 ms at 60,000 batches,
        far more with its CPU taken): an hour-long run retried one batch for 20 minutes,
        while a fresh consumer with a 500 ms wait read the same offset in 2 s. The short
        wait is right on a healthy broker (a range's end costs one empty fetch of that
        wait); a longer one is the price of a slow broker, not a failure."""
        # the configured wait (ClientConfig's, or the spec's consumerProperties) until raised
        current = self._fetch_wait or int(self._config.build().get("fetch.wait.max.ms", 500))
        longer = next((w for w in FETCH_WAITS_MS if w > current), None)
        if longer is None or any(e.code() in UNREACHABLE for e in errors):
            return None  # a broker that cannot be reached is not slow: the timeout says so
        marks = self._watermarks(consumer, partition, timeout=budget)
        if marks is None or marks[1] <= position:
            return None  # nothing to fetch yet: waiting longer would not help
        return longer

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
        if rng.end <= rng.start:
            return
        max_batch_rows = max(1, int(max_batch_rows))
        topic = self.source.topic
        partition = int(rng.partition)
        start, end = int(rng.start), int(rng.end)
        where = f"{topic}/{rng.partition}"
        consumer, errors = self._consumer()
        columns = Columns(rng.partition)

        try:
            try:
                consumer.assign([TopicPartition(topic, partition, start)])
            except KafkaException as exc:
                raise self._config.translate(exc, f"assigning {where}") from None
            position = start  # next offset we have not seen
            last_progress = time.monotonic()
            eof_at: int | None = None
            asked = False  # whether this stall asked for a longer fetch wait already
            done = False
            while not done:
                # Ask for exactly what is left: one more would wait for the end-of-partition
                # event, an empty fetch the broker holds for fetch.wait.max.ms (100 ms per
                # range per batch). EOF still ends a range whose last offsets do not exist.
                remaining = end - position
                try:
                    msgs = consumer.consume(
                        num_messages=max(1, min(CONSUME_CHUNK, remaining)), timeout=0.5
                    )
                except KafkaException as exc:
                    raise self._config.translate(exc, f"reading {where}") from None
                except RuntimeError as exc:
                    raise RetryableError(f"reading {where}: {exc}") from None
                if not msgs:
                    stalled = time.monotonic() - last_progress
                    if not asked and stalled > min(STALL_SECONDS, self.timeout / 2):
                        # once per stall, and within what is left of the timeout: a broker
                        # that cannot answer must still fail the read within ``timeout``
                        asked = True
                        longer = self._longer_wait(consumer, partition, position, errors,
                                                   max(0.1, self.timeout - stalled))
                        if longer is not None:
                            log.warning(
                                "%s: no record for %.1fs though the broker holds offset %d; asking "
                                "again with fetch.wait.max.ms=%d (a slow or starved broker answers "
                                "shorter fetches with nothing)", where, stalled, position, longer)
                            consumer.close()
                            self._fetch_wait = longer
                            consumer, errors = self._consumer()
                            try:
                                consumer.assign([TopicPartition(topic, partition, position)])
                            except KafkaException as exc:
                                raise self._config.translate(exc, f"assigning {where}") from None
                            last_progress = time.monotonic()
                            asked = False
                            continue
                        stalled = time.monotonic() - last_progress
                    if stalled > self.timeout:
                        raise self._unavailable(
                            consumer, partition, where, position, end, eof_at, errors
                        )
                    continue
                if any_error(msgs):
                    good = []
                    for m in msgs:
                        err = m.error()
                        if err is None:
                            good.append(m)
                            continue
                        if err.code() == EOF:
                            eof_at = m.offset()
                            if eof_at >= end:
                                done = True
                                break
                            continue
                        if err.code() in (OFFSET_RESET, OUT_OF_RANGE):
                            raise self._out_of_range(consumer, partition, where, position, end)
                        raise self._config.translate(KafkaException(err), f"reading {where}")
                    msgs = good
                if msgs:
                    first, last = msgs[0].offset(), msgs[-1].offset()
                    if first < position or last >= end:
                        # offsets increase: what lies outside the range is a head or a tail
                        # (a head is never expected; exactly once anyway)
                        offsets = offsets_of(msgs)
                        msgs = msgs[bisect_left(offsets, position):bisect_left(offsets, end)]
                        if last >= end:
                            done = True
                    if msgs:
                        columns.add(msgs)
                        position = msgs[-1].offset() + 1
                        last_progress = time.monotonic()
                        asked = False
                        if position >= end:
                            done = True
                while columns.rows >= max_batch_rows:
                    yield columns.take(max_batch_rows)
            if columns.rows:
                yield columns.take(columns.rows)
        finally:
            try:
                consumer.close()
            except (KafkaException, RuntimeError):
                pass

    def close(self) -> None:
        """Nothing to release: every ``read`` builds and closes its own consumer."""

    def _watermarks(self, consumer: Consumer, partition: int,
                    timeout: float | None = None) -> tuple[int, int] | None:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self.source.topic, partition),
                timeout=self.timeout if timeout is None else timeout, cached=False
            )
            return int(low), int(high)
        except KafkaException:
            return None

    def _out_of_range(
        self, consumer: Consumer, partition: int, where: str, position: int, end: int
    ) -> Exception:
        marks = self._watermarks(consumer, partition)
        if marks is not None and position < marks[0]:
            return PermanentError(
                f"offsets [{position}, {end}) of {where} are no longer available: the first available "
                f"offset is {marks[0]} (records were deleted by retention); reset this supervisor "
                "to a position at or after it"
            )
        high = marks[1] if marks else "unknown"
        return RetryableError(
            f"offset {position} of {where} is not available yet (high watermark {high}, range end {end})"
        )

    def _unavailable(
        self,
        consumer: Consumer,
        partition: int,
        where: str,
        position: int,
        end: int,
        eof_at: int | None,
        errors: deque[KafkaError],
    ) -> Exception:
        recent = [e for e in errors if e.code() != EOF]
        if recent:
            err = self._config.translate(KafkaException(recent[-1]), f"reading {where}")
            if isinstance(err, PermanentError) or recent[-1].code() in UNREACHABLE:
                return err
        marks = self._watermarks(consumer, partition)
        if marks is None:
            detail = f"; last error: {self._config.scrub(recent[-1].str())}" if recent else ""
            return RetryableError(
                f"reading {where}: no record from Kafka at {self.source.bootstrap_servers} within "
                f"{self.timeout:g}s and positions cannot be read{detail}; check that the brokers are up"
            )
        low, high = marks
        if position < low:
            return PermanentError(
                f"offsets [{position}, {end}) of {where} are no longer available: the first available "
                f"offset is {low} (records were deleted by retention); reset this supervisor "
                "to a position at or after it"
            )
        if high >= end and eof_at is None:
            # The broker has the range (a busy broker, or this worker starved of CPU): saying
            # that the range end is not served yet would send the operator the wrong way.
            return RetryableError(
                f"offsets [{position}, {end}) of {where} are on the broker (high watermark {high}) "
                f"but none arrived within {self.timeout:g}s: the broker or this worker is slow "
                "(check their CPU); the batch is retried"
            )
        seen = f", the partition ends at {eof_at}" if eof_at is not None else ""
        return RetryableError(
            f"offsets [{position}, {end}) of {where} are not available within {self.timeout:g}s "
            f"(high watermark {high}{seen}); the range end was taken from a position the broker "
            "does not serve yet"
        )
