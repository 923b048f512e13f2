"""A class-data-sharing archive of Spark's JVM, so a local session starts in ~4 s, not ~6.5 s.

Most of a SparkSession's start is the JVM loading and verifying Spark's classes. A
dynamic CDS archive (JDK 13+) holds them pre-parsed; the JVM maps it at start. The
archive is built once, by a process of its own whose JVM starts a session, runs a small
job through the product's sink and exits (``-XX:ArchiveClassesAtExit``), written under
a temporary name and renamed into place. ``scripts/setup.sh`` builds it; by hand::

    .venv/bin/python -m reconciler.pipeline.sparkcds

It lives in the virtualenv (``<prefix>/share/stream-reconciler/``), named after what
it depends on: the ``java`` binary, the pyspark installation and the user (whose
private SPARK_HOME, ``sparkhome``, is on the recorded class path). A local session
uses it when it exists; the JVM checks it again itself and, when anything differs,
starts without it (``-Xshare:auto``), as it would with no archive: only slower.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from reconciler.pipeline import spark, sparkconf
from reconciler.pipeline.sparkconf import archive_path, java_options  # noqa: F401  (the commands' names)


def build(prefix: str | os.PathLike[str] | None = None) -> Path:
    """Build the archive and return its path. The JVM that records it is this process's
    own, started here and stopped before returning, so call it where no SparkSession runs
    (``python -m reconciler.pipeline.sparkcds``). Raises ``RuntimeError`` when it could
    not be built."""
    if spark.current_session() is not None:
        raise RuntimeError("a SparkSession already runs in this process: build the archive in a fresh one")
    path = archive_path(prefix)
    if path is None:
        raise RuntimeError("no java found: install Java 17 (scripts/setup.sh) first")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    os.close(fd)
    os.unlink(tmp)  # the JVM creates it as it exits
    try:
        _dump(tmp)
        if not Path(tmp).is_file() or Path(tmp).stat().st_size == 0:
            raise RuntimeError("the JVM exited without writing the class archive")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def _dump(target: str) -> None:
    """A session whose JVM writes its loaded classes to ``target`` as it exits, after the
    kinds of job a batch runs (an RDD of task indices on a classic session, ``mapInArrow``
    over ``range`` where there are no RDDs: ``tasks``)."""
    sparkconf.STATIC_CONF["spark.driver.extraJavaOptions"] = f"-XX:ArchiveClassesAtExit={target}"
    sparkconf.ARCHIVE_OPTIONS_ENABLED = False  # never record while mapping an older archive
    session = spark.get_session(master="local[1]")
    from pyspark import SparkContext

    from reconciler.pipeline.tasks import RESULT_SCHEMA

    jvm = SparkContext._gateway.proc  # the JVM writes the archive as it exits: wait for that
    session.sparkContext.parallelize(range(2), 2).mapPartitions(_indices).collect()
    session.range(0, 2, 1, 2).mapInArrow(_describe, RESULT_SCHEMA).collect()
    spark.stop_session()
    jvm.stdin.close()  # its end of input is the JVM's signal to exit
    jvm.wait(timeout=240)


def _indices(indices):
    for index in indices:
        yield ("data", "x", None, int(index), 1)


def _describe(batches):
    import pyarrow as pa

    for batch in batches:
        n = batch.num_rows
        yield pa.RecordBatch.from_pydict({"kind": ["data"] * n, "path": ["x"] * n, "chunk": [None] * n,
                                          "rows": [1] * n, "bytes": [1] * n})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and (args[0] != "--prefix" or len(args) != 2):
        print("usage: python -m reconciler.pipeline.sparkcds [--prefix DIR]", file=sys.stderr)
        return 2
    try:
        path = build(args[1] if args else None)
    except RuntimeError as exc:
        print(f"sparkcds: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. the virtualenv belongs to another user
        print(f"sparkcds: cannot write the archive: {exc}", file=sys.stderr)
        return 1
    print(f"Spark class archive: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
