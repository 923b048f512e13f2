"""A process that runs batches allocates Arrow memory from jemalloc, unless the operator names a pool."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHOOSE = ("from reconciler.pipeline import arrowpool; import pyarrow as pa; "
          "print(arrowpool.use_preferred(), pa.default_memory_pool().backend_name, arrowpool.use_preferred())")


def _in_a_new_process(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", CHOOSE], env={**clean, **env}, capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout.split()


def test_jemalloc_by_default():
    assert _in_a_new_process() == ["jemalloc", "jemalloc", "jemalloc"]


@pytest.mark.parametrize("pool", ["system", "mimalloc"])
def test_the_operators_pool_wins(pool):
    assert _in_a_new_process(ARROW_DEFAULT_MEMORY_POOL=pool) == [pool, pool, pool]


class _Captured(Exception):
    pass


class _Builder:
    """Records what ``_classic`` configures and stops there: no session is built."""

    def __init__(self):
        self.conf: dict[str, str] = {}

    def master(self, _m):
        return self

    def appName(self, _n):  # noqa: N802 - pyspark's name
        return self

    def config(self, k, v):
        self.conf[k] = v
        return self

    def getOrCreate(self):  # noqa: N802 - pyspark's name
        raise _Captured()


@pytest.mark.parametrize(("conf", "env", "wanted"), [
    ({}, None, "jemalloc"),
    ({}, "system", "system"),
    ({"spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}, None, "mimalloc"),  # the operator's conf
])
def test_a_clusters_executors_are_told_the_pool(monkeypatch, conf, env, wanted):
    """Executors do not inherit the daemon's environment: the session passes the pool on."""
    from pyspark.sql import SparkSession

    from reconciler.pipeline import spark

    builder = _Builder()
    monkeypatch.setattr(SparkSession, "builder", builder)
    if env is None:
        monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    else:
        monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", env)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    with pytest.raises(_Captured):
        spark._classic("spark://127.0.0.1:7077", "t", {}, conf)
    assert builder.conf["spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL"] == wanted


def test_a_local_session_leaves_it_to_the_inherited_environment(monkeypatch):
    from pyspark.sql import SparkSession

    from reconciler.pipeline import spark

    builder = _Builder()
    monkeypatch.setattr(SparkSession, "builder", builder)
    for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP"):
        monkeypatch.setenv(k, os.environ.get(k, sys.executable if "PYTHON" in k else "127.0.0.1"))
    monkeypatch.setattr(spark.sparkhome, "use_private_home", lambda: None)
    with pytest.raises(_Captured):
        spark._classic("local[2]", "t", {}, {})
    assert not any(k.startswith("spark.executorEnv.") for k in builder.conf)
