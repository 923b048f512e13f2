"""What the table itself says about exactly once: the keys a batch snapshot's summary
carries, and the table properties that keep the offsets of expired snapshots.

A batch snapshot's summary names its supervisor, batch, epoch, source generation and
the ``[partition, start, end)`` ranges it read (plus, per partition, how many records the
readers delivered: a range may hold offsets without a record, a transaction marker or a
RabbitMQ tracking entry). When snapshots expire, their ranges and counts are folded into
table properties (``reconciler.expired-ranges``, ``reconciler.expired-read``), keyed by
supervisor and generation, so ``verify`` still covers them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping

SUPERVISOR = "reconciler.supervisor"
BATCH = "reconciler.batch-id"
EPOCH = "reconciler.epoch"
RANGES = "reconciler.ranges"  # JSON [[partition, start, end], ...]
RECORDS = "reconciler.records"
UNPARSEABLE = "reconciler.unparseable"
DATASOURCE = "reconciler.datasource"
GENERATION = "reconciler.generation"  # a fresh start's new source: absent means 0
READ = "reconciler.read"  # JSON {partition: records delivered}
ROLLUP_PROPERTY = "reconciler.rollup"  # table property and batch summary: "true" | "false"
OPERATION = "reconciler.operation"  # snapshot summary: compact | import (a batch has none)

EXPIRED_RANGES = "reconciler.expired-ranges"  # table property: {key: [[p, s, e], ...]}
EXPIRED_READ = "reconciler.expired-read"  # table property: {key: {p: records}}, absent where unknown


def range_key(supervisor: str, generation: int = 0) -> str:
    """The key of a supervisor's ranges in one source generation (``clicks``, ``clicks@1``)."""
    return supervisor if not generation else f"{supervisor}@{generation}"


def parse_range_key(key: str) -> tuple[str, int]:
    sid, _, gen = key.partition("@")
    return sid, int(gen) if gen.isdigit() else 0


def summary_ranges(properties: Mapping[str, str]) -> list[tuple[str, int, int]]:
    """The ``[partition, start, end)`` ranges a snapshot summary carries (none for others)."""
    raw = properties.get(RANGES)
    if not raw:
        return []
    return [(str(p), int(s), int(e)) for p, s, e in json.loads(raw)]


def summary_read(properties: Mapping[str, str]) -> dict[str, int] | None:
    """Records delivered per partition, when the batch recorded them."""
    raw = properties.get(READ)
    if not raw:
        return None
    return {str(p): int(n) for p, n in json.loads(raw).items()}


def summary_key(properties: Mapping[str, str]) -> str | None:
    sid = properties.get(SUPERVISOR)
    if not sid:
        return None
    return range_key(sid, int(properties.get(GENERATION, "0") or 0))


def expired_ranges(properties: Mapping[str, str]) -> dict[str, list[tuple[str, int, int]]]:
    """The offset ranges of expired snapshots, per range key."""
    raw = properties.get(EXPIRED_RANGES)
    if not raw:
        return {}
    return {key: [(str(p), int(s), int(e)) for p, s, e in ranges] for key, ranges in json.loads(raw).items()}


def expired_read(properties: Mapping[str, str]) -> dict[str, dict[str, int]]:
    raw = properties.get(EXPIRED_READ)
    if not raw:
        return {}
    return {key: {str(p): int(n) for p, n in counts.items()} for key, counts in json.loads(raw).items()}


def fold_ranges(*sources: Mapping[str, Iterable[tuple[str, int, int]]]) -> dict[str, list[list]]:
    """Ranges per key with adjacent ones merged (``[a, b)`` + ``[b, c)`` = ``[a, c)``);
    overlapping and non-adjacent ranges stay apart, so overlaps and gaps remain visible."""
    merged: dict[str, dict[str, list[list[int]]]] = defaultdict(lambda: defaultdict(list))
    for src in sources:
        for sid, ranges in src.items():
            for p, s, e in ranges:
                merged[sid][str(p)].append([int(s), int(e)])
    out: dict[str, list[list]] = {}
    for sid, parts in sorted(merged.items()):
        rows = []
        for p, spans in sorted(parts.items()):
            spans.sort()
            cur = spans[0][:]
            for s, e in spans[1:]:
                if s == cur[1]:
                    cur[1] = e
                else:
                    rows.append([p, *cur])
                    cur = [s, e]
            rows.append([p, *cur])
        out[sid] = rows
    return out


def fold_expired(properties: Mapping[str, str], expired_summaries: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The table properties after the snapshots with ``expired_summaries`` are expired: their
    ranges folded into ``reconciler.expired-ranges``, their delivered counts summed into
    ``reconciler.expired-read`` (a key whose counts are not all known loses its counts)."""
    ranges: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    reads = expired_read(properties)
    unknown = set(expired_ranges(properties)) - set(reads)
    for props in expired_summaries:
        key, rs = summary_key(props), summary_ranges(props)
        if key is None or not rs:
            continue
        ranges[key] += rs
        read = summary_read(props)
        if read is None:
            unknown.add(key)
            continue
        counts = reads.setdefault(key, {})
        for p, n in read.items():
            counts[p] = counts.get(p, 0) + n
    folded = fold_ranges(expired_ranges(properties), ranges)
    out = {EXPIRED_RANGES: json.dumps(folded, separators=(",", ":"), sort_keys=True)}
    known = {k: v for k, v in reads.items() if k not in unknown}
    if known or EXPIRED_READ in properties:
        out[EXPIRED_READ] = json.dumps(known, separators=(",", ":"), sort_keys=True)
    return out
