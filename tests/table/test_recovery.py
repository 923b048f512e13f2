"""Start-up recovery with the table as the output: files of batches that never committed are
deleted, committed ones never touched, and a clean-up that fails never stops a leader."""

from __future__ import annotations

import pytest

from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.pipeline import segments
from reconciler.runtime.recovery import recover
from reconciler.store.store import Store


def _batch_dir(root, table, batch):
    d = root / "default" / table / "data" / f"batch={batch}" / "time_chunk=20261120T1000Z"
    d.mkdir(parents=True)
    (d / "part-0.parquet").write_bytes(b"PAR1")
    return d.parent


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    s.create_supervisor(SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "t"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}), None, actor="test")
    s.init_checkpoints("clicks", {"0": 0})
    s.publish(supervisor_id="clicks", epoch=1, batch_id="done", datasource="clicks",
              ranges=[PartitionRange("0", 0, 5)], files=[], records=5, unparseable=0)
    yield s
    s.close()


def test_uncommitted_batches_go_committed_stay(store, tmp_path):
    root = tmp_path / "segments"
    kept = _batch_dir(root, "clicks", "done")
    gone = [_batch_dir(root, "clicks", "crashed"), _batch_dir(root, "clicks_deadletter", "crashed")]
    assert recover(store, root) == {"orphansDeleted": 2}
    assert kept.exists() and not any(p.exists() for p in gone)
    assert recover(store, root) == {"orphansDeleted": 0}
    assert recover(store, tmp_path / "nothing-yet") == {"orphansDeleted": 0}


def test_a_clean_up_that_fails_is_logged_and_leading_goes_on(store, tmp_path, monkeypatch, caplog):
    root = tmp_path / "segments"
    orphan = _batch_dir(root, "clicks", "crashed")

    def refuse(*paths):
        raise PermissionError(13, "Permission denied", str(paths[0]))

    monkeypatch.setattr(segments, "discard", refuse)  # the filesystem refusing, not a stand-in for a service
    assert recover(store, root) == {"orphansDeleted": 0}
    assert orphan.exists() and "cannot delete uncommitted batch directory" in caplog.text


def test_recovery_imports_neither_pyiceberg_nor_the_transform(tmp_path):
    """Recovery runs between taking the lease and the first pass, before a fresh daemon's
    Spark session can start: importing pyiceberg (the catalog) and pandas (the transform)
    there cost 0.7 s of every cold ``reconciler run``. It needs neither, with a table on disk
    and a write in flight to clean up."""
    import json
    import subprocess
    import sys

    probe = f"""
import json, sys
from pathlib import Path
from reconciler.model import SupervisorSpec
from reconciler.runtime.recovery import recover
from reconciler.store.store import Store
root = Path({str(tmp_path)!r})
store = Store(f"sqlite:///{{root / 'r.db'}}")
store.migrate()
store.create_supervisor(SupervisorSpec.from_document({{
    "id": "clicks", "source": {{"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "t"}},
    "dataSchema": {{"datasource": "clicks", "timestamp": {{"column": "ts"}}}}}}), None, actor="test")
store.begin_write("w" * 32, "batch", tables=["clicks"], supervisor_id="clicks")
d = root / "segments" / "default" / "clicks" / "data" / ("batch=" + "w" * 32) / "time_chunk=20261120T1000Z"
d.mkdir(parents=True)
(d / "part-0.parquet").write_bytes(b"PAR1")
result = recover(store, root / "segments")
print(json.dumps({{"result": result, "left": d.exists(), **{{m: m in sys.modules for m in ("pyiceberg", "pandas")}}}}))
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["result"] == {"orphansDeleted": 1} and doc["left"] is False, doc  # it did clean up
    assert doc["pyiceberg"] is False and doc["pandas"] is False, doc
