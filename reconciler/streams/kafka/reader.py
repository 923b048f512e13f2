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
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

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
# (``KafkaRangeReader._longer_wait``; kept for the rest of the process's reads of that topic),
# and the stall that raises it.
#
# The first wait is short. A range's records exist (its end was the high watermark), so a
# healthy broker answers at once and the wait only matters where a broker holds a fetch for
# its whole wait: Tansu does whenever one partition of the fetch has nothing to send yet, and
# a read of a 0.25 s batch at 20,000 records/s took 110 / 244 ms (p50 / p95) with a 100 ms
# wait, 54 / 119 ms with 20 (``benchmarks/README.md``, issue 45, third stop). A broker too
# slow to answer within it is found by a stall, sooner at this first wait, and then asked
# with 100 ms by every later read of this process.
FIRST_FETCH_WAIT_MS = 20
FETCH_WAITS_MS = (100, 500, 2000)
STALL_SECONDS = 2.0
FIRST_STALL_SECONDS = 0.25
_raised: dict[tuple[str, str], int] = {}  # (bootstrap servers, topic) -> the wait a stall raised
_PARTITION = Message.partition


class KafkaRangeReader:
    """Reads exactly ``[start, end)`` of one partition of a topic as Arrow batches.

    ``timeout`` bounds every wait: no progress for that long (the range is not
    available yet, or the broker went away) raises ``RetryableError``.
    """

    def __init__(self, source: KafkaSource, *, timeout: float = DEFAULT_TIMEOUT):
        self.source = source
        self.timeout = timeout
        self._config = ClientConfig(source, timeout)
        # fetch.wait.max.ms to ask with: None is the configured one (a spec that sets it keeps
        # it until a stall raises it); raised by a stall, for every later read of this topic
        self._key = (source.bootstrap_servers, source.topic)
        configured = "fetch.wait.max.ms" in (source.consumer_properties or {})
        self._fetch_wait: int | None = _raised.get(self._key) or (None if configured else FIRST_FETCH_WAIT_MS)

    def _consumer(self) -> tuple[Consumer, deque[KafkaError]]:
        # librdkafka's prefetch (queued.min.messages, 100,000) is kept: sized to a small range,
        # it cut the fetches past the range's end (1.1-1.2 a read against 1.7-2.0), but a read
        # that needed a second fetch waited for it, and the reads' tail rose from ~250 to ~350
        # ms on Tansu at 20,000 records/s (benchmarks/README.md, issue 45, third stop)
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
        for _rng, batch in self.read_many([rng], max_batch_rows):
            yield batch

    def read_many(self, ranges: Sequence[PartitionRange],
                  max_batch_rows: int = 65536) -> Iterator[tuple[PartitionRange, pa.RecordBatch]]:
        """Exactly the records of each range (``read``'s contract per range), read by one
        consumer assigned to every range's partition at once: one connection and one fetch
        for all of them instead of a consumer and a fetch chain per range, one after the
        other (each ~17 ms on a quiet broker before its first record, a small batch's
        largest cost). Batches come as ``(range, batch)``, ranges interleaved; each range's
        in offset order."""
        live = [r for r in ranges if r.end > r.start]
        left = {int(r.partition): _Range(r) for r in live}
        if len(left) != len(live):
            raise ValueError("read_many: one range per partition")
        if not left:
            return
        max_batch_rows = max(1, int(max_batch_rows))
        topic = self.source.topic
        where = f"{topic}/" + ",".join(s.rng.partition for s in left.values())
        consumer, errors = self._consumer()

        def assign() -> None:
            try:
                consumer.assign([TopicPartition(topic, p, s.position) for p, s in left.items()])
            except KafkaException as exc:
                raise self._config.translate(exc, f"assigning {where}") from None

        try:
            assign()
            # the timeout counts from the last record, whatever was tried since: a consumer
            # asked again with a longer wait starts a new wait (``waited_from``), not a new clock
            last_progress = waited_from = time.monotonic()
            asked = False  # whether this wait asked for a longer fetch wait already
            while left:
                # Ask for exactly what is left: one more would wait for the end-of-partition
                # event, an empty fetch the broker holds for fetch.wait.max.ms (100 ms per
                # range per batch). EOF still ends a range whose last offsets do not exist.
                remaining = sum(s.end - s.position for s in left.values())
                try:
                    msgs = consumer.consume(num_messages=max(1, min(CONSUME_CHUNK, remaining)), timeout=0.5)
                except KafkaException as exc:
                    raise self._config.translate(exc, f"reading {where}") from None
                except RuntimeError as exc:
                    raise RetryableError(f"reading {where}: {exc}") from None
                if not msgs:
                    now = time.monotonic()
                    stalled = now - last_progress
                    first = (self._fetch_wait or FETCH_WAITS_MS[0]) < FETCH_WAITS_MS[0]
                    limit = FIRST_STALL_SECONDS if first else STALL_SECONDS
                    if not asked and now - waited_from > min(limit, self.timeout / 2) \
                            and stalled < self.timeout:
                        # once per stall, and within what is left of the timeout: a broker
                        # that cannot answer must still fail the read within ``timeout``
                        asked = True
                        budget = max(0.1, self.timeout - stalled)
                        longer = next((w for p, s in left.items() if (w := self._longer_wait(
                            consumer, p, s.position, errors, budget)) is not None), None)
                        if longer is not None:
                            log.log(logging.INFO if first else logging.WARNING,
                                    "%s: no record for %.1fs though the broker holds the next offsets; asking "
                                    "again with fetch.wait.max.ms=%d (a slow or starved broker answers "
                                    "shorter fetches with nothing)", where, stalled, longer)
                            consumer.close()
                            self._fetch_wait = longer
                            _raised[self._key] = max(_raised.get(self._key, 0), longer)
                            consumer, errors = self._consumer()
                            assign()
                            waited_from = time.monotonic()
                            asked = False
                            continue
                        stalled = time.monotonic() - last_progress
                    if stalled > self.timeout:
                        p, s = min(left.items(), key=lambda item: item[1].position - item[1].rng.start)
                        raise self._unavailable(consumer, p, f"{topic}/{p}", s.position, s.end, s.eof_at, errors)
                    continue
                progressed = False
                runs = list(_runs(msgs, len(left) > 1))
                # A run that reaches its range's end stops that partition's fetches now, before
                # its records are taken: the queue it came from is empty, and librdkafka's next
                # look at it (every fetch.queue.backoff.ms) would fetch past the end.
                ending = [TopicPartition(topic, p) for p, run in runs if (s := left.get(p)) is not None
                          and (m := run[-1]).error() is None and m.offset() >= max(s.end - 1, s.position)]
                if ending:
                    consumer.pause(ending)
                for p, run in runs:
                    s = left.get(p)
                    if s is None:  # a range already done: what was fetched past its end
                        continue
                    if any_error(run):
                        run = self._events(consumer, p, s, run)
                    if run and s.take(run):
                        progressed = True
                    while s.columns.rows >= max_batch_rows:
                        yield s.rng, s.columns.take(max_batch_rows)
                    if s.done:
                        # Stop fetching it before the caller gets its last batch: while the
                        # caller parses and writes, librdkafka would fetch past the end (the
                        # last range's too, until the close after that batch).
                        consumer.pause([TopicPartition(topic, p)])
                        del left[p]
                        if s.columns.rows:
                            yield s.rng, s.columns.take(s.columns.rows)
                if progressed:
                    last_progress = waited_from = time.monotonic()
                    asked = False
        finally:
            try:
                consumer.close()
            except (KafkaException, RuntimeError):
                pass

    def _events(self, consumer: Consumer, partition: int, s: _Range, msgs: list[Message]) -> list[Message]:
        """The records of ``msgs`` (one partition's), its events applied to ``s``: an EOF at or
        past the range's end ends it; an offset out of range fails the read."""
        good = []
        for m in msgs:
            err = m.error()
            if err is None:
                good.append(m)
                continue
            if err.code() == EOF:
                s.eof_at = m.offset()
                if s.eof_at >= s.end:
                    s.done = True
                    break
                continue
            where = f"{self.source.topic}/{partition}"
            if err.code() in (OFFSET_RESET, OUT_OF_RANGE):
                raise self._out_of_range(consumer, partition, where, s.position, s.end)
            raise self._config.translate(KafkaException(err), f"reading {where}")
        return good

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


class _Range:
    """One range's progress in ``read_many``."""

    def __init__(self, rng: PartitionRange):
        self.rng = rng
        self.position = int(rng.start)  # next offset not seen
        self.end = int(rng.end)
        self.eof_at: int | None = None
        self.done = False
        self.columns = Columns(rng.partition)

    def take(self, msgs: list[Message]) -> bool:
        """Keep the records of ``msgs`` (records only, offsets increasing) within the range;
        whether any were."""
        first, last = msgs[0].offset(), msgs[-1].offset()
        if first < self.position or last >= self.end:
            # offsets increase: what lies outside the range is a head or a tail
            # (a head is never expected; exactly once anyway)
            offsets = offsets_of(msgs)
            msgs = msgs[bisect_left(offsets, self.position):bisect_left(offsets, self.end)]
            if last >= self.end:
                self.done = True
        if not msgs:
            return False
        self.columns.add(msgs)
        self.position = msgs[-1].offset() + 1
        if self.position >= self.end:
            self.done = True
        return True


def _runs(msgs: list[Message], several: bool) -> Iterator[tuple[int, list[Message]]]:
    """``msgs`` cut into runs of one partition each, in order. librdkafka hands a fetch's
    partitions one after the other, so the runs are few; with one partition assigned, the
    whole chunk is one run without looking at each message."""
    if not several or msgs[0].partition() == msgs[-1].partition() and len(msgs) < 3:
        yield msgs[0].partition(), msgs
        return
    parts = np.fromiter(map(_PARTITION, msgs), np.int64, len(msgs))
    cuts = [0, *(np.flatnonzero(parts[1:] != parts[:-1]) + 1).tolist(), len(msgs)]
    for a, z in zip(cuts, cuts[1:], strict=False):
        yield int(parts[a]), msgs[a:z]
