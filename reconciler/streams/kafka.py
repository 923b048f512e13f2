"""Kafka partitions, positions and range reads with confluent-kafka (librdkafka).

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
"""

from __future__ import annotations

import logging
import time
import uuid
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from reconciler.errors import PermanentError, RetryableError
from reconciler.model import KafkaSource, PartitionRange
from reconciler.spec import secrets
from reconciler.streams.base import RECORD_SCHEMA, SourceMissing

log = logging.getLogger(__name__)
_rdkafka_log = logging.getLogger("reconciler.streams.kafka.librdkafka")

DEFAULT_TIMEOUT = 10.0  # seconds: every broker call is bounded by this
CONSUME_CHUNK = 10_000  # messages per Consumer.consume() call

# librdkafka error codes, by name (confluent_kafka.KafkaError attributes)
_EOF = KafkaError._PARTITION_EOF
_OFFSET_RESET = getattr(KafkaError, "_AUTO_OFFSET_RESET", -140)
_OUT_OF_RANGE = KafkaError.OFFSET_OUT_OF_RANGE
_UNREACHABLE = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._RESOLVE,
    KafkaError._WAIT_COORD,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.BROKER_NOT_AVAILABLE,
}
_AUTH = {
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError._SSL,
}
_MISSING = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
}

# Settings every client of this module relies on; consumerProperties cannot change them.
_FORCED = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
}


class _Config:
    """The client configuration of one source, and the secret values to keep out of messages.

    References are resolved each time a client is built (a rotated ``${file:..}``
    secret is picked up by the next client), never earlier.
    """

    def __init__(self, source: KafkaSource, timeout: float):
        self.source = source
        self.timeout = timeout
        self.secret_values: list[str] = []

    def build(self) -> dict[str, Any]:
        """The resolved configuration (holds secrets: never log it)."""
        props = dict(self.source.consumer_properties or {})
        resolved = secrets.resolve_mapping(props)
        self.secret_values = [
            str(resolved[k])
            for k, v in props.items()
            if (secrets.has_reference(v) or secrets.redact(v, str(k)) == secrets.REDACTED)
            and str(resolved[k])
        ]
        ms = max(1000, int(self.timeout * 1000))
        conf: dict[str, Any] = {
            "bootstrap.servers": self.source.bootstrap_servers,
            "group.id": f"reconciler-{uuid.uuid4().hex}",  # never joined, never committed
            "client.id": "stream-reconciler",
            "socket.timeout.ms": max(ms, 1100),  # librdkafka wants fetch.wait.max.ms + 1000 at least
            "socket.connection.setup.timeout.ms": ms,
            "session.timeout.ms": max(6000, ms),
            "fetch.queue.backoff.ms": 10,
            "fetch.wait.max.ms": 100,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "logger": _rdkafka_log,
        }
        conf.update(resolved)
        conf.update(_FORCED)
        return conf

    def scrub(self, text: str) -> str:
        for value in self.secret_values:
            text = text.replace(value, secrets.REDACTED)
        return secrets.scrub(text)  # also the truncated or escaped copies librdkafka echoes

    def consumer(self, **extra: Any) -> Consumer:
        return self.consumer_with_errors(**extra)[0]

    def consumer_with_errors(self, **extra: Any) -> tuple[Consumer, deque[KafkaError]]:
        """A new consumer, and the errors librdkafka reports for it outside of consume()."""
        conf = self.build()
        errors: deque[KafkaError] = deque(maxlen=16)
        conf["error_cb"] = errors.append
        conf.update(extra)
        try:
            consumer = Consumer(conf)
        except KafkaException as exc:
            raise PermanentError(
                f"invalid Kafka client configuration (consumerProperties): {self.scrub(_err_text(exc))}"
            ) from None
        except (ValueError, TypeError) as exc:
            raise PermanentError(
                f"invalid Kafka client configuration (consumerProperties): {self.scrub(str(exc))}"
            ) from None
        return consumer, errors

    def translate(self, exc: BaseException, doing: str) -> Exception:
        """A library exception as RetryableError or PermanentError with an operator's message."""
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        where = f"Kafka at {self.source.bootstrap_servers}"
        text = self.scrub(_err_text(exc))
        if err is not None and err.code() in _AUTH:
            return PermanentError(
                f"{doing}: {where} refused the client ({text}); check the SASL/SSL settings in "
                "consumerProperties and the ACLs for this topic"
            )
        if err is not None and err.code() in _MISSING:
            return SourceMissing(
                f"{doing}: topic {self.source.topic!r} does not exist on {self.source.bootstrap_servers}"
            )
        if err is not None and err.code() in _UNREACHABLE:
            return RetryableError(
                f"{doing}: cannot reach {where} within {self.timeout:g}s ({text}); check "
                "bootstrapServers, that the brokers are up, and network/TLS settings"
            )
        if err is not None and not err.retriable() and err.fatal():
            return PermanentError(f"{doing}: {where}: {text}")
        return RetryableError(f"{doing}: {where}: {text}")


def _err_text(exc: BaseException) -> str:
    if exc.args and isinstance(exc.args[0], KafkaError):
        err = exc.args[0]
        return f"{err.name()}: {err.str()}"
    return str(exc)


class KafkaAdapter:
    """Positions of one Kafka topic. Partitions are named by their number as text."""

    def __init__(self, source: KafkaSource, *, timeout: float = DEFAULT_TIMEOUT):
        self.source = source
        self.timeout = timeout
        self._config = _Config(source, timeout)
        self._consumer: Consumer | None = None
        self._partitions: list[str] | None = None
        self._times = None  # kafka_times.RecordTimes, built on first use

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
            and tmd.error.code() in _MISSING
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
        return {p: high for p, (_low, high) in self.watermarks().items()}

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

    def record_times(self, offsets: Mapping[str, int]) -> dict[str, int | None]:
        """The timestamp of the record at each offset: see ``kafka_times``."""
        if self._times is None:
            from reconciler.streams.kafka_times import RecordTimes

            self._times = RecordTimes(self._config, self.source.topic, self.timeout)
        return self._times.at(offsets)

    def close(self) -> None:
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

    def __init__(self, config: _Config, topic: str, timeout: float):
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
                    if err.code() == _EOF:
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
                    elif err.code() == _EOF:
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


class KafkaRangeReader:
    """Reads exactly ``[start, end)`` of one partition of a topic as Arrow batches.

    ``timeout`` bounds every wait: no progress for that long (the range is not
    available yet, or the broker went away) raises ``RetryableError``.
    """

    def __init__(self, source: KafkaSource, *, timeout: float = DEFAULT_TIMEOUT):
        self.source = source
        self.timeout = timeout
        self._config = _Config(source, timeout)

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
        if rng.end <= rng.start:
            return
        max_batch_rows = max(1, int(max_batch_rows))
        topic = self.source.topic
        partition = int(rng.partition)
        start, end = int(rng.start), int(rng.end)
        where = f"{topic}/{rng.partition}"
        consumer, errors = self._config.consumer_with_errors()
        part_array_cache: dict[int, pa.Array] = {}

        def part_array(n: int) -> pa.Array:
            arr = part_array_cache.get(n)
            if arr is None:
                arr = pa.repeat(pa.scalar(rng.partition, pa.string()), n)
                if len(part_array_cache) < 8:
                    part_array_cache[n] = arr
            return arr

        offsets: list[int] = []
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        stamps: list[int] = []

        def flush(n: int) -> pa.RecordBatch:
            ts = pa.array(stamps[:n], pa.int64())
            if n and min(stamps[:n]) < 0:  # -1: no timestamp
                import pyarrow.compute as pc  # rare; ~0.1 s to import in every new worker

                ts = pc.if_else(pc.less(ts, 0), pa.scalar(None, pa.int64()), ts)
            batch = pa.RecordBatch.from_arrays(
                [
                    part_array(n),
                    pa.array(offsets[:n], pa.int64()),
                    pa.array(keys[:n], pa.binary()),
                    pa.array(values[:n], pa.binary()),
                    ts.cast(pa.timestamp("ms", tz="UTC")),
                ],
                schema=RECORD_SCHEMA,
            )
            del offsets[:n], keys[:n], values[:n], stamps[:n]
            return batch

        try:
            try:
                consumer.assign([TopicPartition(topic, partition, start)])
            except KafkaException as exc:
                raise self._config.translate(exc, f"assigning {where}") from None
            position = start  # next offset we have not seen
            last_progress = time.monotonic()
            eof_at: int | None = None
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
                    if time.monotonic() - last_progress > self.timeout:
                        raise self._unavailable(
                            consumer, partition, where, position, end, eof_at, errors
                        )
                    continue
                bad = [m for m in msgs if m.error() is not None]
                if bad:
                    good = []
                    for m in msgs:
                        err = m.error()
                        if err is None:
                            good.append(m)
                            continue
                        if err.code() == _EOF:
                            eof_at = m.offset()
                            if eof_at >= end:
                                done = True
                                break
                            continue
                        if err.code() in (_OFFSET_RESET, _OUT_OF_RANGE):
                            raise self._out_of_range(consumer, partition, where, position, end)
                        raise self._config.translate(KafkaException(err), f"reading {where}")
                    msgs = good
                if msgs:
                    batch_offsets = [m.offset() for m in msgs]
                    lo = 0
                    if batch_offsets[0] < position:  # never expected; keep exactly-once anyway
                        lo = bisect_left(batch_offsets, position)
                    hi = len(batch_offsets)
                    if batch_offsets[-1] >= end:
                        hi = bisect_left(batch_offsets, end)
                        done = True
                    if lo or hi < len(msgs):
                        msgs = msgs[lo:hi]
                        batch_offsets = batch_offsets[lo:hi]
                    if msgs:
                        offsets.extend(batch_offsets)
                        keys.extend([m.key() for m in msgs])
                        values.extend([m.value() for m in msgs])
                        stamps.extend([m.timestamp()[1] for m in msgs])
                        position = batch_offsets[-1] + 1
                        last_progress = time.monotonic()
                        if position >= end:
                            done = True
                while len(offsets) >= max_batch_rows:
                    yield flush(max_batch_rows)
            if offsets:
                yield flush(len(offsets))
        finally:
            try:
                consumer.close()
            except (KafkaException, RuntimeError):
                pass

    def close(self) -> None:
        """Nothing to release: every ``read`` builds and closes its own consumer."""

    def _watermarks(self, consumer: Consumer, partition: int) -> tuple[int, int] | None:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self.source.topic, partition), timeout=self.timeout, cached=False
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
        recent = [e for e in errors if e.code() != _EOF]
        if recent:
            err = self._config.translate(KafkaException(recent[-1]), f"reading {where}")
            if isinstance(err, PermanentError) or recent[-1].code() in _UNREACHABLE:
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
        seen = f", the partition ends at {eof_at}" if eof_at is not None else ""
        return RetryableError(
            f"offsets [{position}, {end}) of {where} are not available within {self.timeout:g}s "
            f"(high watermark {high}{seen}); the range end was taken from a position the broker "
            "does not serve yet"
        )


def consumer_config(source: KafkaSource, timeout: float = DEFAULT_TIMEOUT) -> Mapping[str, Any]:
    """The resolved client configuration (for diagnostics: holds secrets, never log it)."""
    return _Config(source, timeout).build()
