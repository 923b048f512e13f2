"""RabbitMQ Streams with another application storing its offsets on the same stream, end
to end: a real node, real Spark, the daemon in this process.

Each ``store_offset`` writes a tracking entry into the stream that takes an offset and
is never sent to a consumer, so checkpoints and range ends land on such entries. Once,
a checkpoint there was taken for "deleted by retention" and the supervisor stopped.
"""

from __future__ import annotations

import pytest

import devservices
from reconciler.store.store import Store
from tests.e2e import helpers as h
from tests.streams.test_rabbitmq_bookkeeping import store_offset

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq, pytest.mark.spark]


def daemon(settings, timeout: float = 120.0) -> None:
    code, _ = h.run_daemon(settings, timeout=timeout)
    assert code == 0, "the daemon did not catch up in time"


def test_another_application_storing_offsets_between_batches(spark, rabbit_node, stream, tmp_path):
    name = stream()
    uri = rabbit_node.stream_uri
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("orders", h.rabbit_source(uri, [name]), max_batch_records=120))

    def produce(start: int, n: int) -> None:
        assert devservices.produce_rabbit(uri, name, devservices.make_records(n, start=start)) == n

    produce(0, 300)  # offsets 0..299
    store_offset(rabbit_node, name, 299)  # 300
    daemon(s)
    store = Store(s.db_url)
    try:
        assert store.checkpoints("orders") == {name: 300}  # the end of the last record

        produce(300, 300)  # 301..600: the checkpoint sits on the tracking entry at 300
        store_offset(rabbit_node, name, 450)  # 601
        store_offset(rabbit_node, name, 600, reference="audit-app")  # 602
        daemon(s)
        h.assert_exactly_once(h.key_counts(spark, s, "orders"), [f"k{i:06d}" for i in range(600)])
        assert store.checkpoints("orders") == {name: 601}

        # The daemon is down: a tracking entry, 300 records, another entry; then a reset.
        store_offset(rabbit_node, name, 601)  # 603
        produce(600, 300)  # 604..903
        store_offset(rabbit_node, name, 903)  # 904
        out = h.cli_json(s, "reset", "orders", "--to", "latest", "--reason", "lag")
        assert out["backfill"] == "orders-backfill-1"
        assert not out.get("lost"), out  # no record was deleted: nothing may be reported lost
        daemon(s)
        produce(900, 100)  # 905..1004
        daemon(s)

        h.assert_exactly_once(h.key_counts(spark, s, "orders"), [f"k{i:06d}" for i in range(1000)])
        bf = store.get("orders-backfill-1")
        assert str(bf.state) == "COMPLETED"
        assert bf.start_offsets == {name: 601} and bf.end_offsets == {name: 904}
        assert store.checkpoints("orders") == {name: 1005}
        [st] = h.cli_json(s, "status", "orders")["supervisors"]
        assert st["state"] in ("RUNNING", "IDLE") and not st.get("error"), st
        assert store.lost_records("orders") == 0
    finally:
        store.close()
