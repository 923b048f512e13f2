"""Operator control (issue 14): `backfill list|suspend|resume|cancel` and `suspend|resume ID`,
on a real Kafka broker with the daemon ingesting; exactly once by key throughout, and a
cancelled backfill's unread range is recorded, never silent."""

from __future__ import annotations

import json

import pytest

import devservices
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def test_backfill_control_and_operator_suspension(tmp_path, kafka_broker, topic, spark):
    s = h.make_settings(tmp_path)
    name = topic(partitions=2)
    h.write_spec(s.specs, h.spec_doc("ctl", h.kafka_source(kafka_broker.bootstrap, name), start_from="earliest"))
    first = devservices.make_records(3000)
    devservices.produce_kafka(kafka_broker.bootstrap, name, first)
    assert h.run_cli(s, "apply")[0] == 0
    code, out = h.run_cli(s, "reset", "ctl", "--to", "latest", "--reason", "skip ahead")
    assert code == 0, out
    store = Store(s.db_url)
    try:
        [bf] = h.cli_json(s, "backfill", "list")
        assert (bf["id"], bf["parent"], bf["state"], bf["backfill"]["total"]) == ("ctl-backfill-1", "ctl", "PENDING", 3000)

        # a suspended backfill reads nothing while the main goes on
        assert h.run_cli(s, "backfill", "suspend", "ctl-backfill-1", "--reason", "broker overloaded")[0] == 0
        second = devservices.make_records(1000, start=3000)
        ends = devservices.produce_kafka(kafka_broker.bootstrap, name, second)
        h.run_daemon(s, until_caught_up=False, timeout=8.0)
        assert store.get("ctl-backfill-1").state == "SUSPENDED"
        assert sum(store.checkpoints("ctl-backfill-1").values()) == 0
        assert store.checkpoints("ctl") == {str(p): e for p, e in ends.items()}

        assert h.run_cli(s, "backfill", "resume", "ctl-backfill-1")[0] == 0
        assert h.run_daemon(s, until_caught_up=True, timeout=180)[0] == 0
        assert store.get("ctl-backfill-1").state == "COMPLETED"
        h.assert_exactly_once(h.key_counts(spark, s, "ctl"), h.keys(first + second))

        # an operator's suspension outranks the file: no pass resumes it; plan and status say so
        assert h.run_cli(s, "suspend", "ctl", "--reason", "INC-42")[0] == 0
        third = devservices.make_records(1000, start=4000)
        devservices.produce_kafka(kafka_broker.bootstrap, name, third)
        h.run_daemon(s, until_caught_up=False, timeout=4.0)
        assert store.get("ctl").state == "SUSPENDED"
        plan = json.loads(h.run_cli(s, "plan", "-o", "json", "--no-positions")[1])
        assert plan["actions"] == [] and any("suspended by operator" in n and "INC-42" in n for n in plan["notes"])
        [item] = h.cli_json(s, "status", "ctl", "--no-lag")["supervisors"]
        assert item["override"]["reason"] == "INC-42"

        # a cancelled backfill records the range it left unread
        assert h.run_cli(s, "reset", "ctl", "--to", "latest")[0] == 0
        code, out = h.run_cli(s, "backfill", "cancel", "ctl-backfill-2", "--reason", "not needed")
        assert code == 0 and "left unread (1000 records" in out, out
        cancel = [e for e in store.history("ctl-backfill-2") if e["action"] == "cancel-backfill"]
        assert cancel and cancel[0]["details"]["unreadRecords"] == 1000 and cancel[0]["reason"] == "not needed"
        assert h.run_cli(s, "resume", "ctl", "--reason", "INC-42 over")[0] == 0
        assert store.get("ctl").state == "PENDING"
        assert h.run_daemon(s, until_caught_up=True, timeout=180)[0] == 0
    finally:
        store.close()
    # the cancelled range is the only thing missing, and nothing is there twice
    h.assert_exactly_once(h.key_counts(spark, s, "ctl"), h.keys(first + second))
