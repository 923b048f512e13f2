"""A batch's data files: durable, discarded, listed for recovery (writing them: test_tasks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.model import DataSchema, Metric
from reconciler.pipeline import segments as seg
from reconciler.table import durable

HOUR_MS = 3600_000
T0_MS = 1_763_640_000_000  # 2025-11-20T12:00:00Z

DS = DataSchema(
    datasource="clicks",
    timestamp_column="ts",
    dimensions=("id", "user", "__offset"),
    metrics=(Metric("count", "count"), Metric("bytes", "longSum", "bytes")),
    segment_granularity="hour",
)


def test_discard_and_batch_dirs(tmp_path):
    table = tmp_path / "clicks"
    for b in ("b1", "b2"):
        d = table / "data" / f"batch={b}" / "time_chunk=20251120T1200Z"
        d.mkdir(parents=True)
        (d / "part-0.parquet").write_bytes(b"x")
    (table / "data" / ".batch=b0.deleting").mkdir()  # a deletion a crash interrupted
    found = seg.batch_dirs(table)
    assert sorted(found) == ["b1", "b2"] and not (table / "data" / ".batch=b0.deleting").exists()
    seg.discard(found["b1"], tmp_path / "absent")
    assert sorted(seg.batch_dirs(table)) == ["b2"]
    assert seg.batch_dirs(tmp_path / "nothing") == {}


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 300])
def test_bad_batch_ids(bad):
    with pytest.raises(ValueError):
        seg.check_batch_id(bad)


def test_written_batch_totals():
    w = seg.WrittenBatch("b", (seg.DataFile("/a", "c", 3, 30), seg.DataFile("/b", "c", 4, 40)),
                         (seg.DataFile("/d", None, 1, 10),))
    assert (w.rows, w.dead_rows, w.bytes) == (7, 1, 80)
    assert Path(w.files[0].path).name == "a"


def test_a_batchs_files_are_durable_before_their_directories(tmp_path, monkeypatch):
    """Hundreds of files are fsynced a few at a time; every directory entry only after
    every file it may name (a directory fsynced first could name a file not yet on disk)."""
    import os
    import threading

    dirs = [tmp_path / f"time_chunk={h:02d}" for h in range(40)]
    files = []
    for d in dirs:
        d.mkdir()
        for k in range(3):
            (d / f"part-{k}.parquet").write_bytes(b"x" * 10)
            files.append(d / f"part-{k}.parquet")
    synced: list[str] = []
    lock = threading.Lock()
    real = os.fsync

    def recording(fd):
        real(fd)
        with lock:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fsync", recording)
    durable.sync(files, [*dirs, tmp_path / "absent"])
    assert sorted(synced[:len(files)]) == sorted(str(f) for f in files)
    assert sorted(synced[len(files):]) == sorted(str(d) for d in dirs)


def test_a_failed_fsync_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError):
        durable.sync([tmp_path / "gone.parquet"], [tmp_path])


def test_the_fsync_pool_is_kept_and_made_again_in_a_forked_child(tmp_path):
    """One pool per process: no threads started per batch; a forked child (a Spark Python
    worker) has a copy without threads, and gets a pool of its own."""
    import os

    f = tmp_path / "a.parquet"
    f.write_bytes(b"x")
    durable.sync([f])
    pool = durable._executor()
    durable.sync([f])
    assert durable._executor() is pool
    pid = os.fork()
    if pid == 0:  # the child: exits 0 only if its sync completes on a pool of its own
        import signal

        signal.alarm(20)  # a sync waiting on the parent's threads, which the copy lacks, would hang
        try:
            durable.sync([f])
            os._exit(0 if durable._executor() is not pool else 3)
        except BaseException:  # noqa: BLE001
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
