"""Cutting a batch: which offsets the next batch reads, per partition. Pure.

``[checkpoint, min(target, checkpoint + share))`` where target is the latest offset
(main supervisors) or the bounded end (backfills), and the batch-wide budget
``maxBatchRecords`` is shared so that no partition starves: every lagging partition
gets an equal share, and shares unused by short partitions go to the others.
``maxBatchBytes`` becomes a record budget through the mean record size seen so far
(``batch_budget``): offsets carry no size, so bytes can only be estimated.

``batch_tasks`` says how many Spark tasks read the batch; ``pipeline.sources.split_ranges``
then cuts the ranges into that many sub-ranges of equal offset counts, within a partition
too, so one partition's range is read by several tasks at once (Druid, Kafka Connect and
Pinot stop at one reader per partition).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reconciler.model import PartitionRange

ASSUMED_RECORD_BYTES = 512  # before a supervisor's first batch has measured its records
# A main supervisor's range longer than this gets one task per this many offsets when that
# is more than its taskCount: a catch-up (after downtime, a rewind, a new partition read
# from earliest) then uses every executor slot, while a live batch stays as it was. Large
# enough that a task's fixed cost (a consumer, a Python worker's setup, one file per time
# chunk) stays small against its reading, small enough that one partition's share of the
# default maxBatchRecords (1,000,000) splits in 4.
CATCH_UP_SUB_RANGE = 250_000
# More tasks than this never come from catching up: each task writes its own file per time
# chunk, and the publish and readers pay per file until compaction merges them.
MAX_CATCH_UP_TASKS = 16


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


def batch_tasks(ranges: Sequence[PartitionRange], task_count: int, *, bounded: bool,
                sub_range: int | None = None, max_tasks: int | None = None) -> int:
    """How many Spark tasks read a batch of ``ranges``.

    A bounded supervisor (a backfill) uses its ``taskCount`` as it stands: the operator sized
    it. A main supervisor uses its ``taskCount``, or, catching up, one task per ``sub_range``
    offsets of each range larger than that (at most ``max_tasks``) when that is more: only a
    partition far behind is split, so a batch of many partitions each within the threshold
    keeps the parallelism (and the files) its taskCount asks for. Never more tasks than
    offsets (a task with nothing to read is pure cost), never fewer than one."""
    sub_range = CATCH_UP_SUB_RANGE if sub_range is None else sub_range
    max_tasks = MAX_CATCH_UP_TASKS if max_tasks is None else max_tasks
    offsets = sum(r.size for r in ranges)
    tasks = max(1, int(task_count))
    if not bounded and sub_range > 0:
        pieces = sum(-(-r.size // sub_range) for r in ranges if r.size > sub_range)
        tasks = max(tasks, min(max_tasks, pieces))
    return max(1, min(tasks, offsets))
