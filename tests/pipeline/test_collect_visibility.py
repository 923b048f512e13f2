"""``segments._collect`` after a Spark write that succeeded: the job's commit list and every
file it names must be visible where the daemon lists, or the batch fails (and is read again).

The schedule: the executors (through ``objectStore.executorEndpoint``, or on another host of a
shared directory) PUT the batch's files and its commit list; the daemon lists the batch's
prefix before all of them are visible to it (an S3-compatible store replicating between the
site the executors write to and the one the daemon reads, a gateway's cache, NFS attribute
caching). Before the fix the daemon took "no commit list" for "no task committed" and deleted
every file, or published the files it happened to see: either way the checkpoint moved past
records no table holds. Real moto S3 server, real sink writer, Parquet by pyarrow; no Spark."""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pytest

from reconciler.errors import RetryableError
from reconciler.pipeline import segments, sink
from reconciler.table import storage

ROWS = pa.record_batch({"__time": pa.array([datetime(2026, 1, 1)] * 3, pa.timestamp("us")),
                        "id": ["a", "b", "c"],
                        "time_chunk": ["2026-01-01T00:00:00.000Z"] * 3})


def _task(root: str, stem: str) -> list[str]:
    """One Spark task's output, written as the sink's tasks write it."""
    files = sink._Files(root, stem, segments.SEGMENT, storage=storage.at(root))
    index = ROWS.schema.get_field_index(segments.SEGMENT)
    files.add(ROWS.column(index)[0].as_py(), ROWS.remove_column(index))
    return files.close()


@pytest.fixture(params=["bucket", "directory"])
def batch_root(request, tmp_path):
    if request.param == "bucket":
        bucket = request.getfixturevalue("s3_bucket")
        return f"s3://{bucket}/wh/default/clicks/data/batch=0123456789abcdef01234567"
    return str(tmp_path / "wh/default/clicks/data/batch=0123456789abcdef01234567")


def _keys(root: str) -> list[str]:
    return sorted(x.rsplit("/", 1)[-1] for x in storage.at(root).list(root))


def test_a_commit_list_not_visible_yet_fails_the_batch_and_deletes_nothing(batch_root):
    names = _task(batch_root, "part-00000-0-a") + _task(batch_root, "part-00001-0-b")
    # the job committed (its list is on its way); the daemon lists before it arrives
    with pytest.raises(RetryableError, match="commit list"):
        segments._collect(batch_root if "://" in batch_root else __import__("pathlib").Path(batch_root),
                          chunked=True)
    assert len(_keys(batch_root)) == len(names) == 2  # nothing deleted: the fence decides (supervisor._abandon)


def test_a_committed_file_not_visible_yet_fails_the_batch(batch_root):
    names = _task(batch_root, "part-00000-0-a")
    late = names[0].replace("part-00000-0-a", "part-00001-0-b")  # committed by task 1, not visible yet
    files = storage.at(batch_root)
    files.write_bytes(files.join(batch_root, sink.COMMITTED), json.dumps({"files": sorted([*names, late])}).encode())
    with pytest.raises(RetryableError, match="part-00001-0-b"):
        segments._collect(batch_root if "://" in batch_root else __import__("pathlib").Path(batch_root),
                          chunked=True)


def test_a_job_that_wrote_nothing_or_was_skipped_collects_nothing(batch_root):
    # the dead-letter job skipped (no dead letters): no files and no commit list
    path = batch_root if "://" in batch_root else __import__("pathlib").Path(batch_root)
    assert segments._collect(path, chunked=False) == []


def test_failed_attempts_files_still_go_and_committed_ones_stay(batch_root):
    names = _task(batch_root, "part-00000-0-a")
    failed = _task(batch_root, "part-00000-1-z")  # a failed attempt's file, in no commit message
    files = storage.at(batch_root)
    files.write_bytes(files.join(batch_root, sink.COMMITTED), json.dumps({"files": names}).encode())
    path = batch_root if "://" in batch_root else __import__("pathlib").Path(batch_root)
    out = segments._collect(path, chunked=True)
    assert [f.rows for f in out] == [3] and out[0].path.endswith(names[0])
    assert _keys(batch_root) == [names[0].rsplit("/", 1)[-1]]
    assert failed and failed[0] not in names
