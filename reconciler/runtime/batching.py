"""Cutting a batch: which offsets the next batch reads, per partition. Pure.

``[checkpoint, min(target, checkpoint + share))`` where target is the latest offset
(main supervisors) or the bounded end (backfills), and the batch-wide budget
``maxBatchRecords`` is shared so that no partition starves: every lagging partition
gets an equal share, and shares unused by short partitions go to the others.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.streams.base import PartitionRange


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
