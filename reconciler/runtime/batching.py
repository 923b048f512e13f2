"""Cutting a batch: which offsets the next batch reads, per partition. Pure.

``[checkpoint, min(target, checkpoint + share))`` where target is the latest offset
(main supervisors) or the bounded end (backfills), and the batch-wide budget
``maxBatchRecords`` is shared so that no partition starves: every lagging partition
gets an equal share, and shares unused by short partitions go to the others.
``maxBatchBytes`` becomes a record budget through the mean record size seen so far
(``batch_budget``): offsets carry no size, so bytes can only be estimated.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.model import PartitionRange

ASSUMED_RECORD_BYTES = 512  # before a supervisor's first batch has measured its records


def batch_budget(max_records: int, max_bytes: int, record_bytes: float | None) -> int:
    """Records in the next batch: ``max_records``, or fewer when that many records of the
    mean size seen (``record_bytes``; ``ASSUMED_RECORD_BYTES`` before any) exceed ``max_bytes``."""
    size = record_bytes if record_bytes and record_bytes > 0 else ASSUMED_RECORD_BYTES
    return max(1, min(max_records, int(max_bytes // size)))


def cut_ranges(checkpoint: Mapping[str, int], target: Mapping[str, int], max_records: int) -> list[PartitionRange]:
    lag = {p: target[p] - checkpoint[p] for p in target if p in checkpoint and target[p] > checkpoint[p]}
    grant = dict.fromkeys(lag, 0)
    budget = max_records
    open_parts = sorted(lag, key=lambda p: lag[p])
    while budget > 0 and open_parts:
        share = max(1, budget // len(open_parts))
        still_open = []
        for p in open_parts:
            take = min(share, lag[p] - grant[p], budget)
            grant[p] += take
            budget -= take
            if grant[p] < lag[p]:
                still_open.append(p)
            if budget == 0:
                break
        open_parts = still_open
    return [PartitionRange(p, checkpoint[p], checkpoint[p] + n) for p, n in sorted(grant.items()) if n > 0]


def caught_up(checkpoint: Mapping[str, int], target: Mapping[str, int]) -> bool:
    return all(checkpoint.get(p, -1) >= end for p, end in target.items())
