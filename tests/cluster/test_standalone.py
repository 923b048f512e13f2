"""The daemon on a real standalone cluster (``spark://``): a Master and a Worker started from
the installed pyspark on loopback; executors run this virtualenv's Python (``PYSPARK_PYTHON``).

One cluster for the module; each scenario is small and checks exactly once by key.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import devservices
from devservices.spark import StandaloneCluster
from tests.cluster import scenarios as sc
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture(scope="module")
def cluster():
    try:
        c = StandaloneCluster(cores=2, memory="2g").start()
    except devservices.ServiceBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(autouse=True)
def _loopback(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # the daemon's driver, reached by executors


def test_ingest_exactly_once_with_relative_shared_segments(spark, kafka_broker, topic, tmp_path, cluster):
    """Executors write the staged files: the segments directory, given relative to the daemon's
    working directory (executors have another one), is checked shared and used absolute.
    status shows the cluster's master and application id."""
    s = sc.settings(tmp_path, cluster.url)
    env = {**os.environ, **h.settings_env(s), "PYSPARK_PYTHON": sys.executable, "RECONCILER_SEGMENTS": "segments"}
    name = topic(partitions=2)
    records = devservices.make_records(sc.N)
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    h.write_spec(s.specs, h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name), task_count=2,
                                     max_batch_records=sc.MAX_BATCH))
    proc = subprocess.run([str(h.RECONCILER_BIN), "run", "--until-caught-up", "--timeout", "240"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=280, stdin=subprocess.DEVNULL)
    sc.assert_ok(proc)
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), h.keys(records))
    seen = sc.spark_seen(s)
    assert seen["master"] == cluster.url and seen["state"] == "stopped"
    assert "Spark session up: master " + cluster.url + ", application app-" in proc.stderr
    code, text = h.run_cli(s, "status")
    assert code == 0 and "spark: no daemon is running; the last one's session stopped at " in text
    assert f"(master {cluster.url}, application app-" in text


def test_the_warehouse_on_a_bucket_needs_no_shared_directory(spark, s3_server, s3_bucket, kafka_broker, topic,
                                                            tmp_path, cluster):
    """Issue 31: executors on the cluster write the batch's files to the bucket; the daemon
    (only the standard AWS environment) checks they reach it, then commits; every key once,
    the table's files are objects, none is on local disk."""
    s = sc.settings(tmp_path, cluster.url, segments=f"s3://{s3_bucket}/wh")
    seen = sc.ingest(spark, kafka_broker, topic, s)
    assert seen["master"] == cluster.url
    keys = [k for k in s3_server.keys(s3_bucket, "wh/default/clicks/") if not k.endswith("/")]
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".metadata.json") for k in keys)
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".parquet", ".avro")]
    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert report["ok"] and report["deep"]["duplicateOffsets"] == 0 and report["deep"]["rows"] == sc.N


def test_reset_and_backfill(spark, kafka_broker, topic, tmp_path, cluster):
    sc.reset_backfill(spark, kafka_broker, topic, sc.settings(tmp_path, cluster.url))


def test_daemon_killed_then_exactly_once(spark, kafka_broker, topic, tmp_path, cluster):
    sc.crash(spark, kafka_broker, topic, sc.settings(tmp_path, cluster.url))


def test_master_killed_and_restarted(spark, kafka_broker, topic, tmp_path, cluster):
    sc.lost_cluster(spark, kafka_broker, topic, sc.settings(tmp_path, cluster.url),
                    kill=cluster.kill_master, restart=cluster.restart_master,
                    reason=f"Spark master {cluster.url} unreachable")


def test_unreachable_master_is_named_without_tracebacks(kafka_broker, topic, tmp_path):
    """Nothing listens at the master's address: no JVM is started, the supervisor says which
    master is unreachable, and nothing is retried with a traceback."""
    url = f"spark://127.0.0.1:{devservices.free_port()}"
    s = sc.settings(tmp_path, url)
    name = topic(partitions=1)
    devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(10))
    h.write_spec(s.specs, h.spec_doc("nowhere", h.kafka_source(kafka_broker.bootstrap, name)))
    proc = h.run_subprocess(s, "run", "--until-caught-up", "--timeout", "12", timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "stopped SparkContext" not in proc.stderr
    assert f"Spark master {url} unreachable" in proc.stderr
    [st] = h.cli_json(s, "status", "nowhere")["supervisors"]
    assert f"Spark master {url} unreachable" in st["lastError"]
    assert st["state"] == "UNHEALTHY_TASKS"
    assert sc.spark_seen(s)["state"] == "down"
