"""A topic deleted and created again below the checkpoint (issue 41 item 11), end to end.

The hostile round's reproduction on the real broker (Tansu) and real Spark: 30 records
ingested from a 2-partition topic (checkpoint 15 per partition), the topic deleted and
created again, 40 new records (20 per partition). Before the fix ``run --until-caught-up``
read only [15, 20) of each partition, reported IDLE, and 30 new records were never
ingested. Now: UNHEALTHY with the reason by default (and the way out it names works), or,
with ``onRetentionLoss: continue``, every new record exactly once, the restart recorded.
"""

from __future__ import annotations

import pytest

import devservices
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _produce(broker, name: str, start: int, n: int) -> list[str]:
    """``n`` records from key ``start``, alternating between the 2 partitions (n/2 each)."""
    recs = devservices.make_records(n, start=start)
    ends = devservices.produce_kafka(broker.bootstrap, name, recs,
                                     partition_of=lambda key, _value: int(key[1:]) % 2)
    assert sorted(ends.values()) == [n // 2, n // 2]
    return [k for k, _ in recs]


def _ingested_then_recreated(spark, kafka_broker, topic, tmp_path, **spec):
    name = topic(partitions=2)
    old = _produce(kafka_broker, name, 0, 30)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name), **spec))
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    [st] = h.cli_json(s, "status", "clicks")["supervisors"]
    assert {p["partition"]: p["checkpoint"] for p in st["partitions"]} == {"0": 15, "1": 15}

    kafka_broker.delete_topic(name, timeout=10)
    kafka_broker.create_topic(name, 2)
    new = _produce(kafka_broker, name, 1000, 40)
    return s, old, new


def test_recreated_topic_is_unhealthy_with_the_reason_and_the_way_out_works(spark, kafka_broker, topic, tmp_path):
    s, old, new = _ingested_then_recreated(spark, kafka_broker, topic, tmp_path)
    h.run_daemon(s, until_caught_up=False, timeout=20)  # time for several steps

    [st] = h.cli_json(s, "status", "clicks")["supervisors"]
    assert st["state"] == "UNHEALTHY_SUPERVISOR", st
    assert "deleted and created again" in st["runtimeError"]
    assert "--allow-rewind" in st["runtimeError"] and "onRetentionLoss: continue" in st["runtimeError"]
    # nothing skipped: the checkpoints did not move, no new record was read
    assert {p["partition"]: p["checkpoint"] for p in st["partitions"]} == {"0": 15, "1": 15}
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), old)
    code, _ = h.run_daemon(s, timeout=120)  # --until-caught-up never calls it caught up
    assert code == 1

    code, out = h.run_cli(s, "reset", "clicks", "--to", '{"0": 0, "1": 0}', "--allow-rewind",
                          "--reason", "topic re-created")
    assert code == 0, out
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), old + new)
    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert report["deep"]["duplicateOffsets"] == 0, report


def test_recreated_topic_with_continue_reads_every_new_record_once(spark, kafka_broker, topic, tmp_path):
    s, old, new = _ingested_then_recreated(spark, kafka_broker, topic, tmp_path, onRetentionLoss="continue")
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), old + new)
    [st] = h.cli_json(s, "status", "clicks")["supervisors"]
    assert {p["partition"]: p["checkpoint"] for p in st["partitions"]} == {"0": 20, "1": 20}
    assert st["sourceRestarts"] == 1
    [entry] = [e for e in h.cli_json(s, "history", "clicks") if e["action"] == "source-restarted"]
    assert entry["details"]["restartedPartitions"] == {"0": {"checkpoint": 15, "new": 0},
                                                       "1": {"checkpoint": 15, "new": 0}}
    code, out = h.run_cli(s, "history", "clicks")
    assert "deleted and created again" in out
    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert report["ok"], report
