"""Cutting a batch: the shared record budget, maxBatchBytes through the mean record size, and how
many tasks (offset sub-ranges) read it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.model import PartitionRange, SupervisorSpec, parse_size
from reconciler.runtime.batching import (
    ASSUMED_RECORD_BYTES,
    MAX_CATCH_UP_TASKS,
    batch_budget,
    batch_tasks,
    caught_up,
    cut_ranges,
)


def test_the_budget_is_shared_and_short_partitions_give_theirs_away():
    ranges = cut_ranges({"0": 0, "1": 10, "2": 5}, {"0": 100, "1": 12, "2": 5}, 50)
    assert ranges == [PartitionRange("0", 0, 48), PartitionRange("1", 10, 12)]
    assert caught_up({"0": 100, "1": 12}, {"0": 100, "1": 12}) and not caught_up({"0": 99}, {"0": 100})


def test_bytes_bound_the_batch_through_the_mean_record_size():
    assert batch_budget(1_000_000, 64 << 20, None) == (64 << 20) // ASSUMED_RECORD_BYTES  # before any batch
    assert batch_budget(1_000_000, 512 << 20, None) == 1_000_000  # the defaults: records bound the first batch
    assert batch_budget(1_000_000, 512 << 20, 100.0) == 1_000_000  # small records: the record bound holds
    assert batch_budget(1_000_000, 64 << 20, 10_000.0) == 6710  # 10 KB records: the byte bound holds
    assert batch_budget(10, 1024, 10**9) == 1  # never an empty batch


def test_max_batch_bytes_reads_sizes_and_defaults_to_512_mib():
    doc = {"id": "c", "source": {"type": "kafka", "bootstrapServers": "h:9092", "topic": "t"},
           "dataSchema": {"datasource": "c", "timestamp": {"column": "ts"}}}
    assert SupervisorSpec.from_document(doc).max_batch_bytes == 512 << 20
    assert SupervisorSpec.from_document(doc | {"maxBatchBytes": "2GiB"}).max_batch_bytes == 2 << 30
    assert SupervisorSpec.from_document(doc | {"maxBatchBytes": 65536}).max_batch_bytes == 65536
    assert parse_size("1.5 MB") == 1_500_000


# --------------------------------------------------------------------------- tasks and sub-ranges


def _split(ranges, tasks):
    from reconciler.pipeline.sources import split_ranges

    return split_ranges(ranges, tasks)


def test_a_backfill_uses_its_task_count_even_on_one_partition():
    one = [PartitionRange("0", 0, 1_000_000)]
    assert batch_tasks(one, 2, bounded=True) == 2
    assert _split(one, 2) == [[PartitionRange("0", 0, 500_000)], [PartitionRange("0", 500_000, 1_000_000)]]
    # a backfill's taskCount is the operator's: no catch-up split on top of it
    assert batch_tasks([PartitionRange("0", 0, 10_000_000)], 1, bounded=True) == 1


def test_a_main_supervisor_catching_up_splits_ranges_above_the_threshold():
    live = [PartitionRange("0", 500, 3_500)]
    assert batch_tasks(live, 1, bounded=False) == 1  # a live batch stays one task
    assert batch_tasks(live, 3, bounded=False) == 3  # taskCount holds below the threshold
    behind = [PartitionRange("0", 0, 1_000_000)]
    assert batch_tasks(behind, 1, bounded=False) == 4
    assert batch_tasks(behind, 1, bounded=False, sub_range=300_000) == 4  # ceil: no task above the threshold
    assert batch_tasks(behind, 8, bounded=False) == 8  # more tasks asked than the catch-up needs
    # only ranges beyond the threshold are split: four partitions each at it keep taskCount
    assert batch_tasks([PartitionRange(str(p), 0, 250_000) for p in range(4)], 2, bounded=False) == 2
    # one partition far behind among short ones: its pieces decide
    assert batch_tasks([PartitionRange("0", 0, 600_000), PartitionRange("1", 0, 900)], 1, bounded=False) == 3
    assert batch_tasks([PartitionRange("0", 0, 10**9)], 1, bounded=False) == MAX_CATCH_UP_TASKS


@pytest.mark.parametrize("bounded", [True, False], ids=["backfill", "main"])
def test_never_more_tasks_than_offsets_nor_fewer_than_one(bounded):
    assert batch_tasks([PartitionRange("0", 7, 9)], 5, bounded=bounded) == 2
    assert batch_tasks([], 4, bounded=bounded) == 1
    assert batch_tasks([PartitionRange("0", 5, 5), PartitionRange("1", 9, 3)], 4, bounded=bounded) == 1
    # a range smaller than the split count: one offset per sub-range, none empty
    assert _split([PartitionRange("0", 7, 9)], batch_tasks([PartitionRange("0", 7, 9)], 5, bounded=bounded)) == [
        [PartitionRange("0", 7, 8)], [PartitionRange("0", 8, 9)]]


@settings(max_examples=200, deadline=None)
@given(
    spans=st.lists(st.tuples(st.integers(0, 2_000_000), st.integers(0, 1_200_000)), min_size=1, max_size=6),
    task_count=st.integers(1, 8),
    bounded=st.booleans(),
)
def test_the_checkpoint_after_a_split_batch_is_the_end_of_each_partitions_last_sub_range(
        spans, task_count, bounded):
    """What the publish moves the checkpoint to (the batch's range ends) is where the last sub-range
    of each partition ends, and the sub-ranges tile each range: every offset is read by one task."""
    ranges = [PartitionRange(str(p), s, s + n) for p, (s, n) in enumerate(spans)]
    groups = _split(ranges, batch_tasks(ranges, task_count, bounded=bounded))
    subs: dict[str, list[PartitionRange]] = {}
    for group in groups:
        for sub in group:
            subs.setdefault(sub.partition, []).append(sub)
    for r in ranges:
        mine = sorted(subs.get(r.partition, []), key=lambda x: x.start)
        if not r.size:
            assert mine == []
            continue
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))
        assert all(x.size > 0 for x in mine)


def test_the_runtime_hands_the_job_the_tasks_batch_tasks_asks_for(tmp_path, monkeypatch):
    """Through the product's runtime, store and table (the explorer's world, whose job writes one
    file per task and chunk): a main batch far behind is split beyond its taskCount, a backfill's
    batch keeps the backfill's taskCount, and every record lands once."""
    from reconciler.runtime import batching
    from reconciler.store.store import Store
    from tests.explorer.check import truth
    from tests.explorer.world import BACKFILL_TASKS, MAIN, World

    monkeypatch.setattr(batching, "CATCH_UP_SUB_RANGE", 2)  # a 12-offset batch is "far behind"
    url = f"sqlite:///{tmp_path}/w/reconciler.db"
    (tmp_path / "w").mkdir()
    store = Store(url)
    try:
        World.setup(tmp_path / "w", store)
        world = World(tmp_path / "w", url, partitions=1, records=30, store=store)
        proc = world.process("daemon")
        job, seen = proc.ctx.job, []
        run = job.run

        def recording(spec, ranges, batch_id, **kw):
            seen.append((spec.id, sum(r.size for r in ranges), kw["task_count"]))
            return run(spec, ranges, batch_id, **kw)

        monkeypatch.setattr(job, "run", recording)
        world.lead(proc)
        world.step(proc, MAIN)  # [0, 12): 6 pieces of 2 offsets, more than taskCount 3
        world.reset(proc)  # the main jumps to 30, a backfill of [12, 30) with taskCount 2
        world.step_backfills(proc, steps=4)
        assert seen[0] == (MAIN, 12, 6)
        backfills = [s for s in seen if s[0] != MAIN]
        assert backfills and all(tasks == BACKFILL_TASKS for _, _, tasks in backfills), seen
        assert sum(n for _, n, _ in backfills) == 18
        assert truth(world, proc.tables, store, final=False).ok
        world.close()
    finally:
        store.close()
