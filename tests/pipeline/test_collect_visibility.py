"""``segments.finish`` after a Spark job that succeeded: every file its tasks described must
be visible where the daemon lists, or the batch fails (and is read again).

The schedule: the executors (through ``objectStore.executorEndpoint``, or on another host of a
shared directory) PUT the batch's files; the daemon lists the batch's prefix before all of
them are visible to it (an S3-compatible store replicating between the site the executors
write to and the one the daemon reads, a gateway's cache, NFS attribute caching). Publishing
the files it happened to see would move the checkpoint past records no table holds. Real moto
S3 server, real task file writer, Parquet by pyarrow; no Spark."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pytest

from reconciler.errors import RetryableError
from reconciler.pipeline import segments, sink, tasks
from reconciler.table import storage

ROWS = pa.table({"__time": pa.array([datetime(2026, 1, 1)] * 3, pa.timestamp("us")),
                 "id": ["a", "b", "c"],
                 "time_chunk": ["20260101T0000Z"] * 3})


def _task(root: str, stem: str) -> list[tasks.FileDescription]:
    """One task's output, written as the tasks write it, and its descriptions."""
    files = sink.Files(root, stem, segments.SEGMENT, storage=storage.at(root))
    files.add_table(ROWS)
    return [tasks.FileDescription(tasks.DATA, f.name, f.value, f.rows, f.bytes) for f in files.close()]


@pytest.fixture(params=["bucket", "directory"])
def batch_root(request, tmp_path):
    if request.param == "bucket":
        bucket = request.getfixturevalue("s3_bucket")
        return f"s3://{bucket}/wh/default/clicks/data/batch=0123456789abcdef01234567"
    return str(tmp_path / "wh/default/clicks/data/batch=0123456789abcdef01234567")


def _keys(root: str) -> list[str]:
    return sorted(x.rsplit("/", 1)[-1] for x in storage.at(root).list(root))


def _finish(root: str, described: list[tasks.FileDescription]):
    dead = root.replace("/clicks/", "/clicks_deadletter/")
    return segments.finish(tasks.TaskResults(tuple(described), 3, 30), root, dead, "0123456789abcdef01234567")


def test_a_described_file_not_visible_yet_fails_the_batch_and_deletes_nothing(batch_root):
    described = _task(batch_root, "part-00000-0-a")
    late = described[0].path.replace("part-00000-0-a", "part-00001-0-b")  # written by task 1, not visible yet
    with pytest.raises(RetryableError, match="part-00001-0-b"):
        _finish(batch_root, [*described, tasks.FileDescription(tasks.DATA, late, "20260101T0000Z", 3, 100)])
    assert len(_keys(batch_root)) == 1  # nothing deleted: the fence decides (supervisor._abandon)


def test_a_batch_that_wrote_nothing_collects_nothing(batch_root):
    written = _finish(batch_root, [])
    assert written.files == () and written.dead_files == () and written.input_rows == 3


def test_a_killed_attempts_files_go_and_described_ones_stay(batch_root):
    described = _task(batch_root, "part-00000-0-a")
    killed = _task(batch_root, "part-00000-1-z")  # an attempt killed before it reported
    written = _finish(batch_root, described)
    assert [f.rows for f in written.files] == [3] and written.files[0].path.endswith(described[0].path)
    assert written.files[0].segment == "20260101T0000Z" and written.input_bytes == 30
    assert _keys(batch_root) == [described[0].path.rsplit("/", 1)[-1]]
    assert killed and killed[0].path not in {d.path for d in described}
