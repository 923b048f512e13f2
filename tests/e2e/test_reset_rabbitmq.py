"""Reset and backfill on RabbitMQ Streams, end to end: real RabbitMQ node, real Spark, real database.

Each stream of the supervisor's set is one partition; offsets are stream offsets and a
timestamp resolves through the chunks' timestamps. The committed segments are read back
and every key must be there exactly once.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

import devservices
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq, pytest.mark.spark]


def daemon(settings, timeout: float = 120.0) -> None:
    code, _ = h.run_daemon(settings, timeout=timeout)
    assert code == 0, "the daemon did not catch up in time"


class Streams:
    """Two fresh streams; ``produce(start, n)`` sends keys start.. alternately to each."""

    def __init__(self, node, make):
        self.node = node
        self.names = [make(), make()]
        self.ends = dict.fromkeys(self.names, 0)

    def produce(self, start: int, n: int) -> dict[str, int]:
        records = devservices.make_records(n, start=start)
        for i, st in enumerate(self.names):
            part = records[i::2]
            assert devservices.produce_rabbit(self.node.stream_uri, st, part) == len(part)
            self.ends[st] += len(part)
        return dict(self.ends)


def key_range(start: int, n: int) -> list[str]:
    return [f"k{i:06d}" for i in range(start, start + n)]


def rows_by_supervisor(store: Store, datasource: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for seg in store.segments(datasource):
        out[seg["supervisor_id"]] = out.get(seg["supervisor_id"], 0) + seg["rows"]
    return out


@pytest.mark.parametrize("trigger", ["marker", "cli"])
def test_fall_behind_then_reset_to_latest_with_backfill(spark, rabbit_node, stream, tmp_path, db_url, trigger):
    streams = Streams(rabbit_node, stream)
    s = h.make_settings(tmp_path, db_url)
    specs = Path(s.specs)
    h.write_spec(specs, h.spec_doc("orders", h.rabbit_source(rabbit_node.stream_uri, streams.names), task_count=2))
    streams.produce(0, 2000)
    daemon(s)
    store = Store(s.db_url)
    try:
        before = store.checkpoints("orders")
        assert before == {st: 1000 for st in streams.names}

        ends = streams.produce(2000, 4000)  # the daemon is down: 4000 behind
        if trigger == "marker":
            (specs / "orders.reset.yaml").write_text("resetTo: latest\nbackfillTaskCount: 2\nreason: queue lag\n")
        else:
            out = h.cli_json(s, "reset", "orders", "--to", "latest", "--backfill-task-count", "2", "--reason", "queue lag")
            assert out["backfill"] == "orders-backfill-1" and out["backfillRecords"] == 4000
        daemon(s)
        streams.produce(6000, 600)
        daemon(s)

        h.assert_exactly_once(h.key_counts(spark, s, "orders"), key_range(0, 6600))
        bf = store.get("orders-backfill-1")
        assert str(bf.state) == "COMPLETED" and store.get("orders-backfill-2") is None
        assert bf.start_offsets == before and bf.end_offsets == ends
        assert rows_by_supervisor(store, "orders") == {"orders": 2600, "orders-backfill-1": 4000}

        hist = h.cli_json(s, "history", "orders")
        [r] = [e for e in hist if e["action"] == "reset-and-backfill"]
        assert r["reason"] == "queue lag" and r["trigger"].startswith(f"{trigger}: ")
        assert {p["partition"]: (p["checkpoint"], p["latest"], p["new"], p["backfill"])
                for p in r["details"]["partitions"]} == {st: (1000, 3000, 3000, 2000) for st in streams.names}
        code, text = h.run_cli(s, "history", "orders")
        assert code == 0 and "backfill supervisor: orders-backfill-1 (4000 records)" in text
        for st in streams.names:
            assert st in text
        [status] = h.cli_json(s, "status", "orders-backfill-1")["supervisors"]
        assert status["state"] == "COMPLETED"
        assert status["backfill"]["done"] == status["backfill"]["total"] == 4000
        assert (Path(s.state_dir) / "backfills" / "orders-backfill-1.yaml").exists()
    finally:
        store.close()


def test_reset_to_timestamp_offsets_and_shift_on_a_suspended_supervisor(spark, rabbit_node, stream, tmp_path):
    """Forward jumps by stream time, by explicit stream offsets and by a shift, each backfilled."""
    streams = Streams(rabbit_node, stream)
    s = h.make_settings(tmp_path)
    specs = Path(s.specs)
    doc = h.spec_doc("orders", h.rabbit_source(rabbit_node.stream_uri, streams.names))
    h.write_spec(specs, doc)
    streams.produce(0, 400)
    daemon(s)
    h.write_spec(specs, doc | {"suspended": True})
    daemon(s)
    store = Store(s.db_url)
    try:
        assert str(store.get("orders").state) == "SUSPENDED"
        cp = store.checkpoints("orders")
        assert cp == {st: 200 for st in streams.names}
        streams.produce(400, 1000)  # A: 500 per stream
        time.sleep(1.2)  # chunk timestamps of A < t <= those of B
        t = datetime.now(UTC)
        time.sleep(0.3)
        ends = streams.produce(1400, 2000)  # B: 1000 per stream

        iso = t.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        dry = h.cli_json(s, "reset", "orders", "--to", iso, "--dry-run")
        assert {p["partition"]: p["new"] for p in dry["partitions"]} == {st: 700 for st in streams.names}
        out = h.cli_json(s, "reset", "orders", "--to", iso, "--reason", "by time")
        assert {p["partition"]: (p["checkpoint"], p["new"], p["backfill"]) for p in out["partitions"]} == {
            st: (200, 700, 500) for st in streams.names}
        a, b = streams.names
        out = h.cli_json(s, "reset", "orders", "--to", json.dumps({a: 900, b: 750}), "--reason", "by offsets")
        assert out["backfill"] == "orders-backfill-2"
        assert {p["partition"]: (p["new"], p["backfill"]) for p in out["partitions"]} == {a: (900, 200), b: (750, 50)}
        out = h.cli_json(s, "reset", "orders", "--to", '{"shiftBy": 300}', "--reason", "by shift")
        assert {p["partition"]: (p["new"], p["backfill"]) for p in out["partitions"]} == {a: (1200, 300), b: (1050, 300)}
        code, _ = h.run_cli(s, "reset", "orders", "--to", json.dumps({a: ends[a] + 1}))
        assert code == 1  # outside [earliest, latest]: refused
        assert store.checkpoints("orders") == {a: 1200, b: 1050}

        daemon(s)  # the three backfills run; the main stays suspended
        actual = store.read_actual()
        assert all(str(actual.supervisors[f"orders-backfill-{i}"].state) == "COMPLETED" for i in (1, 2, 3))
        assert str(actual.supervisors["orders"].state) == "SUSPENDED"
        assert {e["reason"] for e in store.history("orders") if e["action"] == "reset-and-backfill"} == {
            "by time", "by offsets", "by shift"}

        h.write_spec(specs, doc)  # resume
        streams.produce(3400, 600)
        daemon(s)
        h.assert_exactly_once(h.key_counts(spark, s, "orders"), key_range(0, 4000))
        assert rows_by_supervisor(store, "orders") == {
            "orders": 400 + (ends[a] - 1200) + (ends[b] - 1050) + 600,
            "orders-backfill-1": 1000, "orders-backfill-2": 250, "orders-backfill-3": 600}
    finally:
        store.close()


def test_a_stream_added_while_suspended_is_read_from_its_earliest_offset(spark, rabbit_node, stream, tmp_path):
    """Issue 10.2 on the real node: a stream added to the set is a partition that appeared
    after the supervisor started. With ``startFrom: latest``, suspended meanwhile, a reset
    to latest with a backfill: the new stream's records written before it joined are read
    from its earliest offset (by the backfill), none skipped and the counts say so."""
    old, new = stream(), stream()
    s = h.make_settings(tmp_path)
    specs = Path(s.specs)
    doc = h.spec_doc("orders", h.rabbit_source(rabbit_node.stream_uri, [old]), start_from="latest")
    h.write_spec(specs, doc)
    daemon(s)  # starts at latest of an empty stream: checkpoint 0
    first = devservices.make_records(300)
    devservices.produce_rabbit(rabbit_node.stream_uri, old, first)
    daemon(s)

    h.write_spec(specs, doc | {"suspended": True})
    daemon(s)
    behind = devservices.make_records(200, start=300)
    joined = devservices.make_records(250, start=500)  # written to the new stream before it joins
    devservices.produce_rabbit(rabbit_node.stream_uri, old, behind)
    devservices.produce_rabbit(rabbit_node.stream_uri, new, joined)
    h.write_spec(specs, doc | {"source": h.rabbit_source(rabbit_node.stream_uri, [old, new]), "suspended": False})
    assert h.run_cli(s, "apply")[0] == 0  # the spec change (a stream added: not a change of identity)
    out = h.cli_json(s, "reset", "orders", "--to", "latest", "--backfill", "--reason", "stream added")
    parts = {p["partition"]: p for p in out["partitions"]}
    assert (parts[new]["checkpoint"], parts[new]["new"], parts[new]["backfill"], parts[new]["skipped"]) == (0, 250, 250, 0)
    assert (parts[old]["checkpoint"], parts[old]["backfill"]) == (300, 200)
    assert out["backfillRecords"] == 450
    daemon(s)

    h.assert_exactly_once(h.key_counts(spark, s, "orders"), h.keys(first + behind + joined))
    report = h.cli_json(s, "verify", "orders", "--deep")
    assert report["ok"] and report["deep"]["duplicateOffsets"] == 0 and report["deep"]["rows"] == 750
