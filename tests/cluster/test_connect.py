"""The daemon as a Spark Connect client (``sc://``) of a real Connect server started from the
installed pyspark (its jar ships in the wheel). A batch's Arrow tasks (``mapInArrow``) run in
the server's Python workers (this virtualenv's interpreter): they read, transform and write there.

One server for the module; each scenario is small and checks exactly once by key.
"""

from __future__ import annotations

import pytest

import devservices
from devservices.spark import SparkConnectServer
from tests.cluster import scenarios as sc
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture(scope="module")
def server():
    try:
        srv = SparkConnectServer(master="local[2]").start()
    except devservices.ServiceBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield srv
    finally:
        srv.stop()


def test_ingest_kafka_and_rabbitmq(spark, kafka_broker, topic, rabbit_node, stream, tmp_path, server):
    """Kafka and RabbitMQ tasks over Connect; status shows the Connect URL and the server's
    application id."""
    s = sc.settings(tmp_path, server.url)
    seen = sc.ingest(spark, kafka_broker, topic, s)
    assert seen["master"] == server.url and seen["appId"].startswith("local-")
    streams = [stream(), stream()]
    per = {st: devservices.make_records(800, start=i * 800) for i, st in enumerate(streams)}
    for st, recs in per.items():
        devservices.produce_rabbit(rabbit_node.stream_uri, st, recs)
    h.write_spec(s.specs, h.spec_doc("orders", h.rabbit_source(rabbit_node.stream_uri, streams), task_count=2))
    sc.assert_ok(sc.run(s))
    h.assert_exactly_once(h.key_counts(spark, s, "orders"), [k for recs in per.values() for k in h.keys(recs)])


def test_reset_and_backfill(spark, kafka_broker, topic, tmp_path, server):
    sc.reset_backfill(spark, kafka_broker, topic, sc.settings(tmp_path, server.url))


def test_daemon_killed_then_exactly_once(spark, kafka_broker, topic, tmp_path, server):
    sc.crash(spark, kafka_broker, topic, sc.settings(tmp_path, server.url))


def test_server_killed_and_restarted(spark, kafka_broker, topic, tmp_path, server):
    sc.lost_cluster(spark, kafka_broker, topic, sc.settings(tmp_path, server.url),
                    kill=server.kill, restart=server.start,
                    reason=f"Spark Connect server {server.url} unreachable")
