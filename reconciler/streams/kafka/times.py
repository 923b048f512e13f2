"""The broker's timestamp of the record at an offset, per Kafka partition: the lag in time.

The age of the oldest record not yet ingested is the timestamp of the record at the
checkpoint. One consumer (kept between calls) is assigned every asked partition at its
offset at once and fetches at most one small batch per partition (``max.partition.fetch.bytes``
64 KiB, no prefetch beyond it); the call ends when each partition answered or after
``timeout``, whichever is first, so a slow or absent broker bounds it like a positions call.

Per partition the answer is the timestamp (ms) of the first record at or after the offset
(a compacted or transaction-marker offset is skipped, as the reader skips it), ``None`` when
the partition ends there (nothing to ingest), and absent when it is not known in time (no
answer, a record without a timestamp, an offset the broker no longer has). Separate from
``kafka.py``'s adapter and readers (one hook there), so each can change without the other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

EOF = KafkaError._PARTITION_EOF
_FETCH = {"fetch.max.bytes": 1 << 20, "max.partition.fetch.bytes": 64 << 10, "queued.min.messages": 1}


class RecordTimes:
    """``at(offsets)`` for one topic. ``config`` builds consumers and translates errors
    (``kafka.config.ClientConfig``: ``consumer(**extra)``, ``translate(exc, doing)``)."""

    def __init__(self, config: Any, topic: str, timeout: float):
        self._config = config
        self._topic = topic
        self._timeout = timeout
        self._consumer = None

    def at(self, offsets: Mapping[str, int]) -> dict[str, int | None]:
        want = {int(p): int(o) for p, o in offsets.items()}
        if not want:
            return {}
        if self._consumer is None:
            self._consumer = self._config.consumer(**_FETCH)
        consumer = self._consumer
        try:
            consumer.assign([TopicPartition(self._topic, p, o) for p, o in want.items()])
        except KafkaException as exc:
            self.close()
            raise self._config.translate(exc, f"reading record times of {self._topic!r}") from None
        out: dict[str, int | None] = {}
        settled: set[int] = set()
        deadline = time.monotonic() + self._timeout
        try:
            while len(settled) < len(want):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    msgs = consumer.consume(num_messages=len(want), timeout=min(0.2, left))
                except KafkaException as exc:
                    raise self._config.translate(exc, f"reading record times of {self._topic!r}") from None
                for m in msgs:
                    p = m.partition()
                    if p not in want or p in settled:
                        continue
                    err = m.error()
                    if err is None:
                        if m.offset() < want[p]:  # never expected (assigned at the offset)
                            continue
                        kind, stamp = m.timestamp()
                        if kind != TIMESTAMP_NOT_AVAILABLE and stamp is not None and stamp >= 0:
                            out[str(p)] = int(stamp)
                        settled.add(p)
                    elif err.code() == EOF:
                        if m.offset() >= want[p]:
                            out[str(p)] = None  # the partition ends at the offset: nothing waits there
                            settled.add(p)
                    else:  # out of range, a broker error: not known now
                        log.debug("record time of %s/%s at %s: %s", self._topic, p, want[p], err.str())
                        settled.add(p)
        finally:
            try:
                consumer.unassign()
            except (KafkaException, RuntimeError):
                self.close()
        return out

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError):
                pass
            self._consumer = None
