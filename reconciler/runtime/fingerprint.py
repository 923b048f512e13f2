"""A source's fingerprint: the timestamps of records already ingested, to tell it from a new one.

Without an id to compare (every RabbitMQ stream, a Kafka broker without topic ids, or the
first step after the upgrade, when no id was recorded for the old topic), a source deleted
and created again that already holds more records than the checkpoint looks like the old
one: nothing ends below a checkpoint, so nothing is probed. The record at an offset
already ingested tells them apart: per partition, ``(offset, timestamp)`` of the record at
checkpoint - 1 is taken when a source generation is first seen, and asked again on the
first step of each runtime and every ``RETENTION_CHECK_EVERY`` seconds. Another timestamp
at that offset, or no record there any more, is a source that started over, unless the
earliest offset, read again after the fetch, has passed the offset: retention deleted the
record during the check (``runtime.sourceguard``), and the fingerprint is taken again.

Taken again only when retention deleted the record (or compaction, on Kafka: the broker
answers a later offset, which proves nothing), so the audit log holds a few fingerprints
per source generation, not one a minute; a fingerprint at any ingested offset still in the
source is as good as one at checkpoint - 1.

The first fingerprint of a generation has nothing to be compared with. When the batch that
ingested the record committed before the record's timestamp (by more than ``CLOCK_SKEW``),
the record now there is not the one ingested: the first step after the upgrade on a topic
re-created meanwhile. A producer whose clock runs ahead by more than that would read as a
source started over (UNHEALTHY by default).

``replaced`` and ``written_after`` are pure; ``ask`` asks the adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

Mark = tuple[int, int]  # (offset, timestamp ms) of a record ingested
CLOCK_SKEW = 300.0  # seconds a record's timestamp may run ahead of the batch that ingested it


def offsets_to_mark(checkpoint: Mapping[str, int], earliest: Mapping[str, int]) -> dict[str, int]:
    """Per partition with an ingested record still in the source: the last one ingested."""
    return {p: c - 1 for p, c in checkpoint.items() if p in earliest and c - 1 >= max(earliest[p], 0)}


def ask(adapter, offsets: Mapping[str, int]) -> dict[str, Mark | None]:
    """Per partition, the first record at or after the offset (``(offset, timestamp)``), None
    when the partition no longer holds it, absent when not known (no answer, no timestamp)."""
    if not offsets:
        return {}
    exact = getattr(adapter, "records_at", None)
    if exact is not None:
        return exact(offsets)
    times = getattr(adapter, "record_times", None)  # an adapter without records_at: paired with the offset asked
    if times is None:
        return {}
    out: dict[str, Mark | None] = {}
    for p, t in times(offsets).items():
        if t is not None:
            out[p] = (int(offsets[p]), int(t))
        elif not adapter.holds(p, int(offsets[p])):  # the end is exact on the sources without records_at
            out[p] = None
    return out


def replaced(stored: Mapping[str, Mark], answers: Mapping[str, Mark | None]) -> list[str]:
    """Pure: the partitions whose fingerprinted record is gone or is another record."""
    out = []
    for p, (offset, stamp) in stored.items():
        if p not in answers:
            continue
        got = answers[p]
        if got is None or (got[0] == offset and got[1] != stamp):
            out.append(p)
    return out


def written_after(asked: Mapping[str, int], answers: Mapping[str, Mark | None],
                  ingested: Mapping[str, datetime]) -> list[str]:
    """Pure: the partitions whose record at checkpoint - 1 is younger than the batch that
    ingested that offset (by more than ``CLOCK_SKEW``): not the record ingested. A record
    at a later offset (the asked one compacted away) may be younger: no conclusion."""
    out = []
    for p, got in answers.items():
        if got is None or p not in ingested or got[1] < 0 or got[0] != asked.get(p):
            continue
        if got[1] / 1000.0 > ingested[p].timestamp() + CLOCK_SKEW:
            out.append(p)
    return out
