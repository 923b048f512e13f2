"""``reconciler segments`` on a compacted file (issue 46, a newcomer's re-run): the merged
file has no batch, and its offsets were lost (batch -, ``ranges: []``, ``rangesFrom:
"batch"``) though the table keeps ``__partition``/``__offset`` and the help promises each
file's own statistics. They come from the file's column statistics: exact for a file of one
partition, bounds over the whole file (said so) for a file of several."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from reconciler.store.store import Store
from reconciler.table import compact as mc
from reconciler.table.catalog import BATCH, EPOCH, RANGES, SUPERVISOR, Tables
from tests.cli.test_cli import Cli

T0 = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("__partition", pa.string()),
                    ("__offset", pa.int64()), ("user", pa.string())])


def _batch(tables: Tables, datasource: str, i: int, rows: list[tuple[str, int]]) -> None:
    table = tables.load(datasource) or tables.ensure(datasource, SCHEMA, "hour")
    d = tables.data_dir(table, f"b{i}") / "time_chunk=20260101T1000Z"
    d.mkdir(parents=True)
    data = pa.table({"__time": [T0 + timedelta(seconds=k) for k in range(len(rows))],
                     "__partition": [p for p, _ in rows], "__offset": [o for _, o in rows],
                     "user": ["u"] * len(rows)}, schema=SCHEMA)
    pq.write_table(data, d / "part-00000.parquet")
    ranges = sorted({p: [p, min(o for q, o in rows if q == p), max(o for q, o in rows if q == p) + 1]
                     for p, _ in rows}.values())
    tables.load(datasource).add_files([str(d / "part-00000.parquet")], snapshot_properties={
        SUPERVISOR: datasource, BATCH: f"b{i}", EPOCH: "1", RANGES: json.dumps(ranges)})


def test_a_compacted_files_offsets_come_from_its_statistics(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    db = f"sqlite:///{state / 'reconciler.db'}"
    store = Store(db)
    store.migrate()
    tables = Tables(store.engine, state / "segments")
    try:
        for i in range(2):  # two batches, each of partitions 0-3, offsets 0-4 then 5-9
            _batch(tables, "clicks", i, [(str(p), o) for p in range(4) for o in range(5 * i, 5 * i + 5)])
        for i in range(2):  # one partition alone: exact after compaction
            _batch(tables, "solo", 2 + i, [("2", o) for o in range(10 * i, 10 * i + 10)])
        for name in ("clicks", "solo"):
            result = mc.compact(tables, name, store=store, now=T0 + timedelta(days=2))
            assert result.committed, result.message
    finally:
        store.close()
    run = Cli(tmp_path / "specs", state, db)
    [merged] = run.json("segments", "clicks", "-o", "json")
    assert merged["rows"] == 40 and merged["batch_id"] is None
    assert merged["rangesFrom"] == "file bounds" and merged["ranges"] == []
    assert merged["bounds"] == {"partitions": ["0", "3"], "offsets": [0, 9]}
    text = run("segments", "clicks").stdout
    # half-open like the batch lines (`0:[0,5)`), not an inclusive `offsets 0-9` beside them
    assert "0-3:[0,10) (the file's bounds over partitions 0-3, not per partition)" in text, text
    assert not re.search(r"offsets \d+-\d+", text), text
    [solo] = run.json("segments", "solo", "-o", "json")
    assert solo["rangesFrom"] == "file statistics" and solo["bounds"] is None
    assert solo["ranges"] == [{"partition": "2", "start": 0, "end": 20}]
    assert "2:[0,20)" in run("segments", "solo").stdout
