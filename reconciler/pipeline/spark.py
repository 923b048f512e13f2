"""One SparkSession per process.

Starting a session costs seconds (a JVM, then Python workers on first use), so the
daemon, the CLI and the test session each share one. ``get_session`` builds it on
first call and hands back the same object afterwards; asking for another master
while one is running is an error, not a silent second cluster.

On a cluster (``spark://``, Spark Connect ``sc://``) the executors' Python must have
this package installed: the data sources' readers (``reconciler.streams.*``) run
there, and the segments directory must be a path every executor and this process
share (the staging/promote side of ``segments`` works on local paths).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

_lock = threading.Lock()
_session: SparkSession | None = None
_master: str | None = None

# Settings that every session gets (runtime SQL settings: also valid for Spark Connect).
SQL_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Timestamps as INT64 micros adjusted to UTC (not legacy INT96): pyarrow and DuckDB
    # read __time as timestamp[us, tz=UTC].
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # partitionBy without a sort: a task keeps up to this many open files (one per
    # time chunk) and only falls back to sorting beyond it. Few chunks per batch is
    # the common case; many open writers share the memory for row groups and cost
    # more than the sort (measured: 278 hourly chunks, 64 writers ~25% slower).
    "spark.sql.maxConcurrentOutputFileWriters": "8",
}

# Settings fixed when the JVM starts (ignored by Spark Connect).
STATIC_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # No _SUCCESS markers: staging directories hold only what we move.
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # The 1g default makes Parquet's writers shrink their row groups (and say so on
    # stderr) as soon as a batch spans several time chunks.
    "spark.driver.memory": "2g",
}


def _cores(master: str) -> int:
    m = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", master)
    if m:
        return max(1, int(m[1]))
    if master == "local":
        return 1
    return os.cpu_count() or 2


def _is_remote(master: str) -> bool:
    return master.startswith("sc://")


def get_session(
    master: str = "local[*]",
    app_name: str = "stream-reconciler",
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """The process's SparkSession (built on first call, with the data sources registered).

    ``master`` is ``local[N]``/``local[*]``, ``spark://host:port`` (standalone, YARN-style
    URLs work the same way) or a Spark Connect URL ``sc://host:port``. ``conf`` adds or
    overrides settings for the first call only.
    """
    global _session, _master
    with _lock:
        if _session is not None:
            if master != _master:
                raise RuntimeError(
                    f"a SparkSession for {_master!r} is already running in this process; "
                    f"cannot start another for {master!r} (call stop_session() first)"
                )
            return _session

        settings: dict[str, str] = dict(SQL_CONF)
        settings["spark.sql.shuffle.partitions"] = str(2 * _cores(master))
        if _is_remote(master):
            builder = SparkSession.builder.remote(master).appName(app_name)
        else:
            # Python workers must run this interpreter, else they miss the virtualenv's
            # packages ("Python worker exited unexpectedly"). Locally always; on a
            # cluster an operator's explicit setting wins.
            if master.startswith("local"):
                os.environ["PYSPARK_PYTHON"] = sys.executable
                os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
            else:
                os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
                os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            settings.update(STATIC_CONF)
            if master.startswith("local"):
                os.environ.setdefault(
                    "SPARK_LOCAL_IP", "127.0.0.1"
                )  # stay on loopback, no hostname guess
            builder = SparkSession.builder.master(master).appName(app_name)
        for k, v in (conf or {}).items():
            settings[k] = str(v)

        if _is_remote(master):
            session = builder.getOrCreate()
            for k, v in settings.items():
                session.conf.set(k, v)
        else:
            for k, v in settings.items():
                builder = builder.config(k, v)
            session = builder.getOrCreate()
            session.sparkContext.setLogLevel("WARN")
            _quiet_parquet(session)
            # getOrCreate may hand back a session someone else built: make sure the SQL
            # settings hold regardless.
            for k in SQL_CONF:
                session.conf.set(k, settings[k])

        from reconciler.pipeline.sources import register

        register(session)
        _session, _master = session, master
        return session


def current_session() -> SparkSession | None:
    """The running session, if ``get_session`` built one."""
    return _session


def stop_session() -> None:
    """Stop the process's session (no-op if none); the next ``get_session`` builds anew."""
    global _session, _master
    with _lock:
        if _session is not None:
            try:
                _session.stop()
            finally:
                _session, _master = None, None


def _quiet_parquet(session: SparkSession) -> None:
    """Parquet's MemoryManager warns (and prints a line of its own) whenever writers share
    memory: expected here, and noise in a log of one event per line."""
    try:
        jvm = session.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.ERROR
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel("org.apache.parquet", level)
    except Exception:  # a JVM without log4j 2: keep the noise rather than fail the session
        pass
