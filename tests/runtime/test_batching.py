"""Cutting a batch: the shared record budget, and maxBatchBytes through the mean record size."""

from __future__ import annotations

from reconciler.model import PartitionRange, SupervisorSpec, parse_size
from reconciler.runtime.batching import ASSUMED_RECORD_BYTES, batch_budget, caught_up, cut_ranges


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
