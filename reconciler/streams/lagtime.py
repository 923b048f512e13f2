"""Lag in time: the age of the oldest record not yet ingested, per partition.

It is the broker's timestamp of the record at the checkpoint (Kafka: the record's timestamp;
RabbitMQ Streams: the timestamp of the chunk that holds it), subtracted from now; 0 when the
partition is caught up. Asked only for partitions that are behind, one fetch each
(``StreamAdapter.record_times``), so an observation costs at most one fetch per partition.
Unknown (the broker did not answer in time, or no checkpoint yet) is ``None``, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.streams.base import StreamAdapter


def behind(checkpoint: Mapping[str, int], target: Mapping[str, int]) -> dict[str, int]:
    """The checkpoints of the partitions that are behind their target."""
    return {p: int(cp) for p, cp in checkpoint.items() if p in target and cp < target[p]}


def record_times(adapter: StreamAdapter, checkpoint: Mapping[str, int],
                 target: Mapping[str, int]) -> dict[str, int | None]:
    """``adapter.record_times`` of the partitions that are behind (none asked when none is)."""
    lagging = behind(checkpoint, target)
    return adapter.record_times(lagging) if lagging else {}


def lag_seconds(checkpoint: Mapping[str, int], target: Mapping[str, int], times: Mapping[str, int | None],
                now_ms: int) -> dict[str, float | None]:
    """Per partition of ``target``: seconds since the record at the checkpoint was written."""
    out: dict[str, float | None] = {}
    for p, end in target.items():
        cp = checkpoint.get(p)
        if cp is None:
            out[p] = None
        elif cp >= end:
            out[p] = 0.0
        elif p not in times:
            out[p] = None
        else:
            stamp = times[p]
            out[p] = 0.0 if stamp is None else max(0.0, (now_ms - stamp) / 1000.0)
    return out


def max_seconds(per_partition: Mapping[str, float | None]) -> float | None:
    """The supervisor's lag in time: its partitions' maximum (unknown if any is unknown)."""
    values = list(per_partition.values())
    if not values:
        return 0.0
    if any(v is None for v in values):
        return None
    return max(values)
