"""get_session(): one session per process, configured for the pipeline."""

from __future__ import annotations

import os
import sys

import pytest

from reconciler.pipeline import spark as spark_mod

pytestmark = pytest.mark.spark


def test_one_session_per_process(spark):
    assert spark_mod.get_session("local[2]") is spark
    assert spark_mod.current_session() is spark
    with pytest.raises(RuntimeError, match="already running"):
        spark_mod.get_session("local[1]")


def test_session_settings(spark):
    conf = spark.conf
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"
    assert int(conf.get("spark.sql.shuffle.partitions")) == 4
    assert spark.sparkContext.getConf().get("spark.ui.enabled") == "false"
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_python_workers_use_this_interpreter(spark):
    exe = (
        spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect()
    )
    assert exe == [sys.executable]


def test_cores_of_master():
    assert spark_mod._cores("local[3]") == 3
    assert spark_mod._cores("local") == 1
    assert spark_mod._cores("local[*]") == (os.cpu_count() or 2)


def test_session_info_names_master_and_application(spark):
    info = spark_mod.session_info()
    assert (info["master"], info["state"]) == ("local[2]", "up")
    assert info["appId"] == spark.sparkContext.applicationId


def test_status_file_written_for_status(spark, tmp_path):
    path = tmp_path / "spark.json"
    spark_mod.set_status_file(path)
    try:
        seen = spark_mod.read_status_file(path)
        assert seen["master"] == "local[2]" and seen["appId"].startswith("local-") and seen["pid"] == os.getpid()
    finally:
        spark_mod.set_status_file(None)
    assert spark_mod.read_status_file(tmp_path / "absent.json") is None


def test_unreachable_cluster_is_named():
    from devservices import free_port

    port = free_port()
    assert spark_mod.unreachable_reason(f"spark://127.0.0.1:{port}") == (
        f"Spark master spark://127.0.0.1:{port} unreachable (nothing answers at 127.0.0.1:{port})")
    assert spark_mod.unreachable_reason(f"sc://127.0.0.1:{port}").startswith(
        f"Spark Connect server sc://127.0.0.1:{port} unreachable")
    assert spark_mod.unreachable_reason("local[2]") is None


@pytest.mark.parametrize(
    ("master", "error", "reason"),
    [
        pytest.param("spark://m:7077", "java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext.",
                     "Spark master spark://m:7077 unreachable (Cannot call methods on a stopped SparkContext)", id="stopped"),
        pytest.param("spark://m:7077", "Application has been killed. Reason: All masters are unresponsive! Giving up.",
                     "Spark master spark://m:7077 unreachable (All masters are unresponsive)", id="unresponsive"),
        pytest.param("sc://c:15002", "(org.apache.spark.SparkSQLException) [INVALID_HANDLE.SESSION_CHANGED] ...",
                     "Spark Connect server sc://c:15002 unreachable or restarted (INVALID_HANDLE)", id="connect-restart"),
        pytest.param("sc://c:15002", "<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE",
                     "Spark Connect server sc://c:15002 unreachable or restarted (StatusCode.UNAVAILABLE)", id="connect-down"),
        pytest.param("spark://m:7077", "[DIVIDE_BY_ZERO] Division by zero.", None, id="a-job-error"),
    ],
)
def test_failure_reason(master, error, reason):
    assert spark_mod.failure_reason(RuntimeError(error), master) == reason


def test_other_failures_pass_unchanged(spark):
    exc = ValueError("a bug in a transform")
    assert spark_mod.translate_failure(exc) is exc
    gone = spark_mod.SparkUnavailable("Spark master spark://m:7077 unreachable")
    assert spark_mod.translate_failure(gone) is gone


def test_missing_connect_packages_are_a_permanent_error_with_the_fix(monkeypatch):
    import pyspark.sql.connect.utils as connect_utils

    def missing():
        raise ImportError("[PACKAGE_NOT_INSTALLED] grpcio >= 1.48.1 must be installed; however, it was not found.")

    monkeypatch.setattr(connect_utils, "check_dependencies", missing)
    with pytest.raises(spark_mod.SparkMisconfigured) as info:
        spark_mod._require_connect_packages("sc://h:15002")
    assert "grpcio >= 1.48.1" in str(info.value) and "pip install" in str(info.value)
    assert "pyspark[connect]" in str(info.value)
    assert not isinstance(info.value, spark_mod.SparkUnavailable)


def test_shared_dir_check_passes_locally(spark, tmp_path):
    spark_mod.check_shared_dir(spark, tmp_path / "segments", tasks=2)
    assert list((tmp_path / "segments" / "_staging").iterdir()) == []


def test_healthz_names_the_spark_session(spark):
    from reconciler.observe.metrics import Metrics

    _, body = Metrics().health()
    assert body["spark"]["master"] == "local[2]" and body["spark"]["appId"] == spark.sparkContext.applicationId
