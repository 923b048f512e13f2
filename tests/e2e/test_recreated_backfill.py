"""A topic re-created while a backfill waits, and a DescribeTopics unanswered (issue 41.11), end
to end on Tansu and Spark: each record of the new topic lands once.

Before the fix a backfill running across the re-creation read its bounded range from the NEW
topic while the main supervisor, having found the new topic id, read the new topic from
offset 0 (``onRetentionLoss: continue``); and one unanswered DescribeTopics read the new
topic as the old source for a step. The backfill carries the old source generation, so
``verify --deep`` (which tiles each generation apart) could not see those duplicates: the
tests count the keys in the table.
"""

from __future__ import annotations

import pytest

import devservices
from tests.e2e import helpers as h
from tests.e2e.test_recreated_topic import _produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def test_backfill_across_recreation_lands_each_new_record_once(spark, kafka_broker, topic, tmp_path):
    name = topic(partitions=2)
    _produce(kafka_broker, name, 0, 30)  # 15 per partition
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name),
                                     onRetentionLoss="continue"))
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    # 6 more records (3 per partition), then a reset to latest: backfill [15, 18) per partition
    more = devservices.make_records(6, start=500)
    devservices.produce_kafka(kafka_broker.bootstrap, name, more, partition_of=lambda key, _v: int(key[1:]) % 2,
                              one_record_per_batch=True)
    code, out = h.run_cli(s, "reset", "clicks", "--to", "latest", "--reason", "lag")
    assert code == 0, out
    [bf] = [x for x in h.cli_json(s, "status")["supervisors"] if x["id"] != "clicks"]

    # the topic deleted and created again before the backfill ran: 40 new records
    kafka_broker.delete_topic(name, timeout=10)
    kafka_broker.create_topic(name, 2)
    new = _produce(kafka_broker, name, 1000, 40)
    h.run_daemon(s, timeout=180)

    counts = h.key_counts(spark, s, "clicks")
    twice = sorted(k for k in new if counts.get(k, 0) > 1)
    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert twice == [], (f"{len(twice)} records of the re-created topic landed twice ({twice}); backfill "
                         f"{bf['id']}; verify --deep: ok={report.get('ok')}, "
                         f"duplicateOffsets={report.get('deep', {}).get('duplicateOffsets')}")


def test_one_unanswered_describe_topics_after_recreation_lands_each_new_record_once(
        spark, kafka_broker, topic, tmp_path, monkeypatch):
    """One DescribeTopics without an answer (``topic_id`` turns a timeout into None, as for a
    broker that gives no ids) at the first step after the re-creation, with the new topic
    already past the old checkpoint: that step reads [15, 20) of the new topic as the old
    source, the next one sees the new id and reads it again from 0."""
    from reconciler.streams.kafka import identity

    name = topic(partitions=2)
    _produce(kafka_broker, name, 0, 30)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name),
                                     onRetentionLoss="continue"))
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    kafka_broker.delete_topic(name, timeout=10)
    kafka_broker.create_topic(name, 2)
    # 40 new records, one per batch: the end reported exactly (20 per partition), as Kafka does
    recs = devservices.make_records(40, start=1000)
    devservices.produce_kafka(kafka_broker.bootstrap, name, recs, partition_of=lambda key, _v: int(key[1:]) % 2,
                              one_record_per_batch=True)
    new = [k for k, _ in recs]
    real, calls = identity.topic_id, []

    def once_unanswered(*args, **kwargs):
        calls.append(1)
        return None if len(calls) == 1 else real(*args, **kwargs)

    monkeypatch.setattr(identity, "topic_id", once_unanswered)
    h.run_daemon(s, timeout=180)  # may exit "caught up" right after the unanswered step
    h.run_daemon(s, timeout=180)  # the daemon keeps going: the id is answered now
    assert len(calls) > 1

    counts = h.key_counts(spark, s, "clicks")
    twice = sorted(k for k in new if counts.get(k, 0) > 1)
    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert twice == [], (f"{len(twice)} records of the re-created topic landed twice ({twice}); "
                         f"verify --deep: ok={report.get('ok')}, "
                         f"duplicateOffsets={report.get('deep', {}).get('duplicateOffsets')}")
