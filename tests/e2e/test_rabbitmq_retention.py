"""Behind retention on a real RabbitMQ node: the broker really deletes old segments
(``max-length-bytes`` with small ``stream-max-segment-size-bytes``), real Spark, the
daemon in this process.

What the broker deleted cannot be ingested; it must be recorded (range and count) and
never stall: a reset's backfill starts at the earliest retained offset and completes; a
main supervisor behind retention stops with the count, or continues when its spec says
so. The rows are exactly the retained records by key.
"""

from __future__ import annotations

import pytest

import devservices
from reconciler.model import RabbitSource
from reconciler.store.store import Store
from reconciler.streams.rabbitmq import RabbitStreamAdapter
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq, pytest.mark.spark]

RETENTION = {"max-length-bytes": 60_000, "stream-max-segment-size-bytes": 20_000}
FIRST = 200  # records ingested before the supervisor falls behind


def keys(lo: int, hi: int) -> list[str]:
    return [f"k{i:06d}" for i in range(lo, hi)]


def fall_behind_retention(node, name: str) -> tuple[int, int]:
    """Publish until the broker has deleted records FIRST.. ; returns (earliest, end).
    A new stream without offset tracking: the offset of key k<i> is i."""
    adapter = RabbitStreamAdapter(RabbitSource(uri=node.stream_uri, streams=(name,)), timeout=10)
    n = FIRST
    while adapter.earliest()[name] <= FIRST + 100:
        assert devservices.produce_rabbit(node.stream_uri, name, devservices.make_records(200, start=n),
                                          batch_size=50) == 200
        n += 200
        assert n < 20_000, "the broker never applied retention"
    earliest, end = adapter.earliest()[name], adapter.latest()[name]
    assert end == n
    return earliest, end


def start(spark, rabbit_node, stream, tmp_path, **spec_extra):
    name = stream(arguments=RETENTION)
    s = h.make_settings(tmp_path)
    doc = h.spec_doc("orders", h.rabbit_source(rabbit_node.stream_uri, [name]), **spec_extra)
    h.write_spec(s.specs, doc)
    assert devservices.produce_rabbit(rabbit_node.stream_uri, name, devservices.make_records(FIRST)) == FIRST
    code, _ = h.run_daemon(s)
    assert code == 0
    return name, s, doc


def test_reset_behind_retention_backfills_the_retained_records_and_records_the_loss(
        spark, rabbit_node, stream, tmp_path):
    name, s, _ = start(spark, rabbit_node, stream, tmp_path)
    earliest, end = fall_behind_retention(rabbit_node, name)  # the daemon is down meanwhile
    lost = earliest - FIRST

    out = h.cli_json(s, "reset", "orders", "--to", "latest", "--reason", "behind retention")
    assert out["backfill"] == "orders-backfill-1"
    assert out["lostRecords"] == lost and out["lostRanges"] == {name: [FIRST, earliest]}
    code, _ = h.run_daemon(s)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "orders"), keys(0, FIRST) + keys(earliest, end))
    store = Store(s.db_url)
    try:
        bf = store.get("orders-backfill-1")
        assert str(bf.state) == "COMPLETED"
        assert bf.start_offsets == {name: earliest} and bf.end_offsets == {name: end}
        assert store.checkpoints("orders") == {name: end}
        assert store.lost_records("orders") == lost
    finally:
        store.close()
    [entry] = [e for e in h.cli_json(s, "history", "orders") if e["action"] == "reset-and-backfill"]
    assert entry["details"]["lostRecords"] == lost
    assert entry["details"]["lostRanges"] == {name: [FIRST, earliest]}
    [st] = h.cli_json(s, "status", "orders")["supervisors"]
    assert st["lostRecords"] == lost
    code, text = h.run_cli(s, "status")
    assert code == 0 and f"orders: LOST {lost} records" in text


def test_main_behind_retention_stops_with_the_count_then_continues_when_told(
        spark, rabbit_node, stream, tmp_path):
    name, s, doc = start(spark, rabbit_node, stream, tmp_path)
    earliest, end = fall_behind_retention(rabbit_node, name)
    lost = earliest - FIRST

    code, _ = h.run_daemon(s, until_caught_up=False, timeout=15)
    [st] = h.cli_json(s, "status", "orders")["supervisors"]
    assert st["state"] == "UNHEALTHY_SUPERVISOR", st
    assert f"{lost} records were deleted" in st["lastError"] and f"{name}: [{FIRST}, {earliest})" in st["lastError"]
    assert st["lostRecords"] == 0  # nothing skipped yet: the operator decides
    h.assert_exactly_once(h.key_counts(spark, s, "orders"), keys(0, FIRST))

    h.write_spec(s.specs, {**doc, "onRetentionLoss": "continue"})
    code, _ = h.run_daemon(s)
    assert code == 0
    h.assert_exactly_once(h.key_counts(spark, s, "orders"), keys(0, FIRST) + keys(earliest, end))
    [st] = h.cli_json(s, "status", "orders")["supervisors"]
    assert st["state"] in ("RUNNING", "IDLE") and st["lostRecords"] == lost
    [entry] = [e for e in h.cli_json(s, "history", "orders") if e["action"] == "retention-loss"]
    assert entry["details"]["lostRanges"] == {name: [FIRST, earliest]}
