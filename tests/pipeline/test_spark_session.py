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
