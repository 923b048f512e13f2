"""A long ``java.io.tmpdir`` does not stop a local session's batches (its Unix sockets live elsewhere).

A Unix socket's path is at most 107 bytes (sun_path). Spark puts the sockets under
``java.io.tmpdir`` (PySpark's worker daemon: ``<dir>/.<uuid4>.sock``, 43 bytes after the
directory), so a java.io.tmpdir longer than ~64 bytes - an operator's
``-Djava.io.tmpdir`` in ``spark.driver.extraJavaOptions``, a container's or YARN's working
directory on an executor - makes every task fail where loopback TCP worked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCRIPT = textwrap.dedent('''
    import json, sys
    import pyarrow as pa
    from reconciler.model import DataSchema, KafkaSource, PartitionRange as R, source_to_document
    from reconciler.pipeline import spark, tasks
    from reconciler.pipeline.sources import split_ranges
    from reconciler.streams.base import RECORD_SCHEMA

    class Reader:
        def __init__(self, source=None):
            pass

        def read(self, rng, max_batch_rows=65536):
            offsets = list(range(rng.start, rng.end))
            n = len(offsets)
            yield pa.RecordBatch.from_arrays([
                pa.array([rng.partition] * n, pa.string()), pa.array(offsets, pa.int64()),
                pa.array([b"k"] * n, pa.binary()),
                pa.array([json.dumps({"ts": 1763640000000 + o, "k": "a"}).encode() for o in offsets], pa.binary()),
                pa.array([1763640000000 + o for o in offsets], pa.timestamp("ms", tz="UTC"))], schema=RECORD_SCHEMA)

    out, conf = sys.argv[1], json.loads(sys.argv[2])
    session = spark.get_session(master="local[1]", conf=conf)
    ds = DataSchema(datasource="t", timestamp_column="ts", timestamp_format="millis", dimensions=("k",),
                    segment_granularity="hour")
    plan = tasks.TaskPlan(source=source_to_document(KafkaSource("unused:1", "t")), data_schema=ds,
                          groups=tuple(tuple(g) for g in split_ranges([R("0", 0, 10), R("1", 0, 5)], 2)),
                          data_dir=out + "/t/data/batch=b1", dead_dir=out + "/t_dl/data/batch=b1",
                          store=None, max_batch_rows=128, reader=Reader)
    result = tasks.run(session, plan)
    print("RECORDS", result.records)
''')


def _run(tmp_path, name, conf):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    return subprocess.run([sys.executable, str(script), str(tmp_path / name), json.dumps(conf)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=os.getcwd())


def _long_tmpdir(tmp_path):
    tmpdir = tmp_path / "java-tmp" / "stream-reconciler-spark-scratch-space"
    tmpdir.mkdir(parents=True)
    assert len(str(tmpdir)) > 64, tmpdir  # a directory path, far from PATH_MAX (4096)
    return tmpdir


def test_a_long_java_io_tmpdir_still_runs_a_batch(tmp_path):
    """What ran before this change (TCP loopback) with the same java.io.tmpdir still runs."""
    tmpdir = _long_tmpdir(tmp_path)
    opts = {"spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={tmpdir}"}
    before = _run(tmp_path, "tcp", {**opts, "spark.python.unix.domain.socket.enabled": "false"})
    assert "RECORDS 15" in before.stdout, before.stderr[-3000:]  # the control: the session, the tmpdir are fine
    now = _run(tmp_path, "uds", opts)  # the product's defaults
    assert "RECORDS 15" in now.stdout, now.stderr[-3000:]
