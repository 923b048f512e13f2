"""What every SparkSession this product builds is configured with, and where the class
archive is: settings only, no session (``spark`` builds it, ``sparkcds`` records the archive).

The archive is a class-data-sharing file of Spark's JVM (``sparkcds``). It lives in the
virtualenv (``<prefix>/share/stream-reconciler/``), named after what it depends on: the
``java`` binary, the pyspark installation and the user (whose private SPARK_HOME,
``sparkhome``, is on the recorded class path). A local session maps it when it exists;
the JVM checks it again itself and, when anything differs, starts without it
(``-Xshare:auto``), as it would with no archive: only slower.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from reconciler.pipeline import sparkhome

DEFAULT_MASTER = "local[*]"

# Settings that every session gets (runtime SQL settings: also valid for Spark Connect).
# Since batches became Arrow tasks, Spark writes no Parquet and hands Python workers only
# task ids: the file-writing settings below (here and in STATIC_CONF) no longer act on the
# product's batches; they stay so that Parquet a session writes otherwise keeps the
# warehouse's conventions (UTC micros, no .crc, no _SUCCESS).
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
    # Rows handed to a Python worker go in Arrow batches of at most maxRecordsPerBatch
    # (10,000) rows; a byte limit too makes Spark size the batch after every row (7.7% of
    # a warm batch's JVM time when the sink's rows crossed it). Int.MaxValue turns that off.
    "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647",
}

# Settings fixed when the JVM starts (a Spark Connect server has its own); the operator's
# `spark:` map overrides any of them.
STATIC_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # No _SUCCESS markers: staging directories hold only what we move.
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # The JVM holds no records (a batch's tasks read, transform and write them in Python
    # workers; only a row per task and per file crosses it), so a small heap suffices; an
    # operator's `spark:` map raises it for a cluster driver that needs more.
    "spark.driver.memory": "512m",
    # The parallel collector instead of G1: a batch daemon wants throughput, not short
    # pauses. The JIT's first tier only (C1): the JVM no longer runs per-record code (the
    # tasks' Python workers do), so C2's peak speed buys nothing, while compiling the
    # scheduler's and planner's code at start costs a fresh process seconds. Measured on 2
    # cores, a local session: start 3.97 -> 2.82 s, its first job 2.12 -> 1.14 s, the first
    # Arrow job after it 1.29 -> 1.04 s. Default options, so an operator's
    # spark.driver.extraJavaOptions adds to them.
    "spark.driver.defaultJavaOptions": "-XX:+UseParallelGC -XX:TieredStopAtLevel=1",
    # Hadoop's checksummed local filesystem writes a .crc beside every file, and without
    # Hadoop's native library every file it creates costs a forked `chmod` (from a 2 GB
    # JVM): two per data file, one file per (task, time chunk). The plain local
    # filesystem writes no .crc (nothing here reads them: the collector deleted them),
    # halving those forks; measured 1.3 -> 0.9 CPU s per 112-file batch.
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    # PySpark records the Python call site of every DataFrame and functions call for error
    # messages: five py4j round trips each (most of the 250 ms a warm batch once spent
    # building its plan). The job's call sites are ours, not the operator's.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

# Local masters only (there the workers are this interpreter, with this package, for
# certain): a batch's task workers start from ``sparkworker``, which imports pyspark from
# its cached bytecode. (Workers Spark starts for anything else use ``pyspark.daemon``
# whatever this setting says: ``sparkhome`` gives local sessions a SPARK_HOME without the
# zip for those.)
# Local sessions map the class archive that ``sparkcds`` built, when there is one (off
# while building one: a JVM cannot record an archive while mapping another).
ARCHIVE_OPTIONS_ENABLED = True

DAEMON_MODULE = "reconciler.pipeline.sparkworker"
LOCAL_CONF: dict[str, str] = {
    "spark.python.daemon.module": DAEMON_MODULE,
}


# A Unix socket's path holds at most 107 bytes; PySpark's worker daemon names its socket
# ``<dir>/.<uuid4>.sock`` (42 bytes after the directory).
_SOCKET_NAME_BYTES = 42
_SOCKET_PATH_MAX = 107
_socket_dir: str | None = None


def local_socket_conf() -> dict[str, str]:
    """A local session's executor reaches its Python workers over a Unix socket in a short
    private directory, not over loopback TCP. Over TCP a task's command and input went in
    small writes that waited out Linux's 40 ms delayed ACK before the worker could start:
    a two-task job 80 -> 35 ms (RDD) and 115 -> 61 ms (``mapInArrow``), at every batch.

    Local only: a cluster's executors would need the directory on their own hosts, under
    their own (often long: YARN's container directories) ``java.io.tmpdir``, which Spark
    uses when no directory is given, and a path over the limit fails every task. Here the
    directory is this process's own, under the temporary directory, and when even that is
    too long the session keeps TCP. The operator's ``spark:`` map overrides either way."""
    global _socket_dir
    if _socket_dir is None:
        import atexit
        import tempfile

        for base in (tempfile.gettempdir(), "/tmp"):
            if len(base) + len("/rsock-12345678/") + _SOCKET_NAME_BYTES > _SOCKET_PATH_MAX:
                continue
            try:
                _socket_dir = tempfile.mkdtemp(prefix="rsock-", dir=base)
            except OSError:
                continue
            atexit.register(_remove_socket_dir, _socket_dir)  # empty once the workers stopped
            break
        else:
            _socket_dir = ""
    if not _socket_dir:
        return {}
    return {"spark.python.unix.domain.socket.enabled": "true", "spark.python.unix.domain.socket.dir": _socket_dir}


def _remove_socket_dir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:  # a socket a killed worker daemon left: the directory stays, harmless
        pass


# The JVM reports a rejected archive on its standard output; a daemon's output is its log.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home, "bin", "java") if home else None
    if found is None or not found.exists():
        which = shutil.which("java")
        found = Path(which) if which else None
    return found.resolve() if found is not None else None


def archive_path(prefix: str | os.PathLike[str] | None = None) -> Path | None:
    """Where this installation's archive is (or would be); None without a ``java``."""
    java = _java()
    if java is None:
        return None
    try:
        stamp = java.stat().st_mtime_ns
    except OSError:
        return None
    source = sparkhome.installed_home()
    key = f"{java}:{stamp}:{source}:{os.getuid()}"
    tag = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(prefix or sys.prefix) / "share" / "stream-reconciler" / f"spark-{tag}.jsa"


def java_options(prefix: str | os.PathLike[str] | None = None) -> str | None:
    """The JVM options that use the archive, or None when there is none (or its path has
    whitespace, which Spark's option string cannot carry unquoted)."""
    path = archive_path(prefix)
    if path is None or not path.is_file() or any(c.isspace() for c in str(path)):
        return None
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {_QUIET}"
