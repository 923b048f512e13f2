"""Positions of one Kafka topic: partitions, earliest, latest, offsets for a time, record times.

Tansu 0.6 answers ``latest`` (ListOffsets and the metadata high watermark) with the last
batch's base offset + 1 when a batch holds several records, and answers every timestamp
lookup with offset 0; ``offsets_for_time`` therefore checks the broker's answer against
the records themselves (``_Prober``) and searches by reading when it is wrong.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from reconciler.errors import RetryableError
from reconciler.model import KafkaSource
from reconciler.streams.base import SourceMissing
from reconciler.streams.kafka.config import DEFAULT_TIMEOUT, EOF, MISSING, ClientConfig

log = logging.getLogger(__name__)


class KafkaAdapter:
    """Positions of one Kafka topic. Partitions are named by their number as text."""

    # A topic is deleted and created again as a whole: one partition found re-created moves
    # them all (``runtime.truncation.decide``).
    independent_partitions = False

    def __init__(self, source: KafkaSource, *, timeout: float = DEFAULT_TIMEOUT):
        self.source = source
        self.timeout = timeout
        self._config = ClientConfig(source, timeout)
        self._consumer: Consumer | None = None
        self._partitions: list[str] | None = None
        self._times = None  # times.RecordTimes, built on first use
        self._admin = None  # an AdminClient for the topic id, built on first use

    # -- plumbing ---------------------------------------------------------------------

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = self._config.consumer()
        return self._consumer

    def _fail(self, exc: BaseException, doing: str) -> Exception:
        # A failed client may hold stale state; build a new one next time.
        self.close()
        return self._config.translate(exc, doing)

    def _tps(self, offset: int | None = None) -> list[TopicPartition]:
        parts = self._partitions if self._partitions is not None else self.partitions()
        if offset is None:
            return [TopicPartition(self.source.topic, int(p)) for p in parts]
        return [TopicPartition(self.source.topic, int(p), offset) for p in parts]

    # -- StreamAdapter ----------------------------------------------------------------

    def partitions(self) -> list[str]:
        topic = self.source.topic
        try:
            md = self._client().list_topics(topic, timeout=self.timeout)
        except KafkaException as exc:
            raise self._fail(exc, f"listing partitions of topic {topic!r}") from None
        tmd = md.topics.get(topic)
        if (
            tmd is None
            or tmd.error is not None
            and tmd.error.code() in MISSING
            or not tmd.partitions
        ):
            raise SourceMissing(
                f"topic {topic!r} does not exist on {self.source.bootstrap_servers}"
            )
        if tmd.error is not None:
            raise self._fail(KafkaException(tmd.error), f"listing partitions of topic {topic!r}")
        self._partitions = [str(p) for p in sorted(tmd.partitions)]
        return list(self._partitions)

    def watermarks(self) -> dict[str, tuple[int, int]]:
        """Per partition ``(low, high)`` as the broker answers them (high may be an underestimate)."""
        consumer = self._client()
        out: dict[str, tuple[int, int]] = {}
        for tp in self._tps():
            try:
                low, high = consumer.get_watermark_offsets(tp, timeout=self.timeout, cached=False)
            except KafkaException as exc:
                raise self._fail(exc, f"reading positions of topic {self.source.topic!r}") from None
            out[str(tp.partition)] = (int(low), int(high))
        return out

    def earliest(self) -> dict[str, int]:
        return {p: low for p, (low, _high) in self.watermarks().items()}

    def latest(self) -> dict[str, int]:
        """Every partition's end in one ListOffsets request (``OFFSET_END``, the high watermark
        ``watermarks`` reads): ``watermarks`` asks each partition's low and high in turn, two
        round trips a partition, and each batch's capture waited for them (a busy broker
        answers each in milliseconds, not microseconds)."""
        try:
            answers = self._client().offsets_for_times(self._tps(OFFSET_END), timeout=self.timeout)
        except KafkaException as exc:
            raise self._fail(exc, f"reading positions of topic {self.source.topic!r}") from None
        out: dict[str, int] = {}
        for tp in answers:
            if tp.error is not None:
                raise self._fail(KafkaException(tp.error), f"reading positions of topic {self.source.topic!r}")
            out[str(tp.partition)] = int(tp.offset)
        return out

    def offsets_for_time(self, timestamp_ms: int) -> dict[str, int]:
        """First offset whose record timestamp is >= ``timestamp_ms`` per partition, else the end.

        The broker's answer (ListOffsets by timestamp) is checked against the records
        at and before it; when it is wrong (Tansu answers 0 for every timestamp), the
        offset is found by a binary search over record timestamps (which assumes they
        do not decrease, as CreateTime timestamps of one producer normally do).
        """
        tps = self._tps(int(timestamp_ms))
        try:
            answers = self._client().offsets_for_times(tps, timeout=self.timeout)
        except KafkaException as exc:
            raise self._fail(
                exc, f"looking up offsets by time in topic {self.source.topic!r}"
            ) from None
        marks = self.watermarks()
        out: dict[str, int] = {}
        probe = _Prober(self._config, self.source.topic, self.timeout)
        try:
            for tp in answers:
                p = str(tp.partition)
                low, high = marks[p]
                if tp.error is not None:
                    raise self._fail(KafkaException(tp.error), "looking up offsets by time")
                answer = int(tp.offset)
                if probe.confirms(tp.partition, answer, int(timestamp_ms), low, high):
                    out[p] = answer if answer >= 0 else probe.end_of(tp.partition, high)
                else:
                    log.info(
                        "Kafka answered offset %s for time %s on %s/%s, which its records contradict; "
                        "searching by reading",
                        answer,
                        timestamp_ms,
                        self.source.topic,
                        p,
                    )
                    out[p] = probe.search(tp.partition, int(timestamp_ms), low, high)
        finally:
            probe.close()
        return out

    def identity(self) -> str | None:
        """The topic id (changes when the topic is deleted and created again): ``kafka.identity``."""
        from reconciler.streams.kafka.identity import admin_client, topic_id

        if self._admin is None:
            self._admin = admin_client(self._config)
        return topic_id(self._admin, self._config, self.source.topic, self.timeout)

    def holds(self, partition: str, offset: int) -> bool:
        """Whether the partition still holds a record at ``offset`` or after it: ``kafka.identity``."""
        from reconciler.streams.kafka.identity import PROBE_TIMEOUT, holds

        return holds(self._config, self.source.topic, int(partition), int(offset), min(self.timeout, PROBE_TIMEOUT))

    def records_at(self, offsets: Mapping[str, int]) -> dict[str, tuple[int, int] | None]:
        """Per partition, ``(offset, timestamp)`` of the first record at or after the offset, or
        None when the partition no longer holds it: ``kafka.identity.record_at``."""
        from reconciler.streams.kafka.identity import PROBE_TIMEOUT, record_at

        timeout = min(self.timeout, PROBE_TIMEOUT)
        return {p: record_at(self._config, self.source.topic, int(p), int(o), timeout) for p, o in offsets.items()}

    def record_times(self, offsets: Mapping[str, int]) -> dict[str, int | None]:
        """The timestamp of the record at each offset: see ``kafka.times``."""
        if self._times is None:
            from reconciler.streams.kafka.times import RecordTimes

            self._times = RecordTimes(self._config, self.source.topic, self.timeout)
        return self._times.at(offsets)

    def close(self) -> None:
        self._admin = None  # an AdminClient has no close: dropping it ends its connections
        if self._times is not None:
            self._times.close()
            self._times = None
        if self._consumer is not None:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError):
                pass
            self._consumer = None


class _Prober:
    """Reads single records to check or search offsets by timestamp."""

    def __init__(self, config: ClientConfig, topic: str, timeout: float):
        self._config = config
        self._topic = topic
        self._timeout = timeout
        self._consumer: Consumer | None = None

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _at(self, partition: int, offset: int) -> tuple[int, int] | None:
        """The first record at or after ``offset``: ``(offset, timestamp)``; None at the end."""
        if self._consumer is None:
            self._consumer = self._config.consumer(**{"fetch.max.bytes": 1 << 20})
        c = self._consumer
        c.assign([TopicPartition(self._topic, partition, offset)])
        deadline = time.monotonic() + self._timeout
        try:
            while time.monotonic() < deadline:
                for m in c.consume(num_messages=1, timeout=0.5):
                    err = m.error()
                    if err is None:
                        return m.offset(), m.timestamp()[1]
                    if err.code() == EOF:
                        return None
                    raise self._config.translate(KafkaException(err), "reading a record by offset")
        finally:
            c.unassign()
        raise RetryableError(
            f"reading offset {offset} of {self._topic}/{partition}: no answer within {self._timeout:g}s"
        )

    def end_of(self, partition: int, high: int) -> int:
        """The true end of a partition: from ``high`` (a lower bound), read to the EOF event."""
        return self._scan_tail(partition, high, None, "finding the end")

    def _scan_tail(self, partition: int, start: int, ts: int | None, doing: str) -> int:
        """Read from ``start`` to the EOF event: the first offset whose time is >= ``ts``
        (never, when ``ts`` is None), else the partition's true end."""
        if self._consumer is None:
            self._consumer = self._config.consumer()
        c = self._consumer
        c.assign([TopicPartition(self._topic, partition, start)])
        deadline = time.monotonic() + self._timeout
        end = start
        try:
            while time.monotonic() < deadline:
                for m in c.consume(num_messages=10_000, timeout=0.5):
                    err = m.error()
                    if err is None:
                        if ts is not None and m.timestamp()[1] >= ts:
                            return m.offset()
                        end = m.offset() + 1
                    elif err.code() == EOF:
                        return max(end, m.offset())
                    else:
                        raise self._config.translate(KafkaException(err), doing)
        finally:
            c.unassign()
        return end

    def confirms(self, partition: int, answer: int, ts: int, low: int, high: int) -> bool:
        if answer < 0:  # "no record that late": the last record must be earlier
            if high <= low:
                return True
            last = self._at(partition, high - 1)
            return last is None or last[1] < ts
        rec = self._at(partition, answer)
        if rec is not None and (rec[0] != answer or rec[1] < ts):
            return False
        if answer <= low:
            return True
        before = self._at(partition, answer - 1)
        return before is None or before[0] >= answer or before[1] < ts

    def search(self, partition: int, ts: int, low: int, high: int) -> int:
        lo, hi = low, high  # invariant: every record below lo is earlier than ts
        while lo < hi:
            mid = (lo + hi) // 2
            rec = self._at(partition, mid)
            if rec is None:
                hi = mid
            elif rec[1] >= ts:
                hi = mid
            else:
                lo = rec[0] + 1
        if lo < high:
            return lo
        # Nothing below the (possibly underestimated) high watermark: scan the tail.
        return self._scan_tail(partition, high, ts, "searching by time")
