"""The publish as an Iceberg table commit: its cost per batch, metadata included.

Prints ONE JSON document on stdout (progress on stderr). No broker and no Spark: each
"batch" is ``--files`` small Parquet files written with pyarrow into the table's batch
directory (one hour partition each), then published exactly as the runtime does:
``Tables.stage_append`` (load the table, infer partitions from the files' footers, write
the manifest, manifest list and metadata file) and ``Store.publish`` (epoch and checkpoint
compare-and-swap, the metadata pointer compare-and-swap, the batch row) in one transaction.

Reported per phase (stage, publish, total): median, p95 and max over ``--batches`` commits,
split into the first and the last tenth, so the growth with the table's history shows;
and the same for a plain ``INSERT``-only publish (no table) as the baseline the commit
adds to. SQLite in a temporary directory by default, ``--db URL`` for PostgreSQL.

Usage: ``.venv/bin/python benchmarks/commit.py [--batches 300] [--files 10] [--db URL]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from reconciler.model import PartitionRange, SupervisorSpec  # noqa: E402
from reconciler.store.store import SegmentFile, Store  # noqa: E402
from reconciler.table import catalog as cat  # noqa: E402

SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()), ("user", pa.string()),
                    ("__partition", pa.string()), ("__offset", pa.int64()), ("bytes", pa.int64())])
ROWS_PER_FILE = 1_000
T0 = datetime(2026, 11, 20, tzinfo=UTC)


def _spec(sid: str) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": sid},
        "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}})


def _files(tables: cat.Tables, table, batch: int, n: int, offset: int) -> list[str]:
    out = []
    for i in range(n):
        hour = T0 + timedelta(hours=(batch * n + i) % 48)
        d = tables.data_dir(table, f"b{batch}") / f"time_chunk={hour:%Y%m%dT%H%MZ}"
        d.mkdir(parents=True, exist_ok=True)
        lo = offset + i * ROWS_PER_FILE
        t = pa.table({"__time": pa.array([hour] * ROWS_PER_FILE, pa.timestamp("us", tz="UTC")),
                      "id": [f"k{o}" for o in range(lo, lo + ROWS_PER_FILE)], "user": ["u1"] * ROWS_PER_FILE,
                      "__partition": ["0"] * ROWS_PER_FILE, "__offset": list(range(lo, lo + ROWS_PER_FILE)),
                      "bytes": [100] * ROWS_PER_FILE}, schema=SCHEMA)
        path = d / f"part-{i:05d}.parquet"
        pq.write_table(t, path)
        out.append(str(path))
    return out


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs) * 1000, 2),
            "p95_ms": round(xs[max(0, int(len(xs) * 0.95) - 1)] * 1000, 2), "max_ms": round(xs[-1] * 1000, 2)}


def run(db: str, root: Path, batches: int, files: int) -> dict:
    store = Store(db)
    store.migrate()
    for sid in ("bench", "plain"):
        store.create_supervisor(_spec(sid), None, actor="bench")
        store.init_checkpoints(sid, {"0": 0})
    tables = cat.Tables(store.engine, root / "segments")
    table = tables.ensure("bench", SCHEMA, "hour")
    stage, publish, total, plain = [], [], [], []
    offset = 0
    for b in range(batches):
        paths = _files(tables, table, b, files, offset)
        rng = PartitionRange("0", offset, offset + files * ROWS_PER_FILE)
        summary = {cat.SUPERVISOR: "bench", cat.BATCH: f"b{b}", cat.EPOCH: "1",
                   cat.RANGES: json.dumps([[rng.partition, rng.start, rng.end]])}
        segs = [SegmentFile("x", "", "", p, ROWS_PER_FILE, 1) for p in paths]
        t0 = time.perf_counter()
        commit = tables.stage_append("bench", paths, summary, schema=SCHEMA, granularity="hour")
        t1 = time.perf_counter()
        store.publish(supervisor_id="bench", epoch=1, batch_id=f"b{b}", datasource="bench", ranges=[rng],
                      files=segs, records=rng.size, unparseable=0, table_commits=[commit])
        tables.committed([commit])  # as the runtime does: the next stage starts from this table
        t2 = time.perf_counter()
        store.publish(supervisor_id="plain", epoch=1, batch_id=f"p{b}", datasource="plain", ranges=[rng],
                      files=segs, records=rng.size, unparseable=0)
        t3 = time.perf_counter()
        stage.append(t1 - t0)
        publish.append(t2 - t1)
        total.append(t2 - t0)
        plain.append(t3 - t2)
        offset = rng.end
        if b % 50 == 0:
            print(f"batch {b}: {total[-1] * 1000:.1f} ms", file=sys.stderr)
    tenth = max(1, batches // 10)
    final = tables.load("bench")
    rows = final.scan(selected_fields=("__offset",)).to_arrow().num_rows
    assert rows == offset, (rows, offset)  # every committed row visible once
    store.close()
    return {
        "db": db.split(":", 1)[0], "batches": batches, "files_per_batch": files, "rows_per_file": ROWS_PER_FILE,
        "commit_total": {"all": _stats(total), "first_tenth": _stats(total[:tenth]), "last_tenth": _stats(total[-tenth:])},
        "stage": _stats(stage), "publish_transaction": _stats(publish),
        "baseline_publish_without_table": _stats(plain),
        "snapshots": len(final.metadata.snapshots), "rows_visible": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--db", default="", help="SQLAlchemy URL (default: SQLite in a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-commit-") as tmp:
        root = Path(tmp)
        db = args.db or f"sqlite:///{root / 'reconciler.db'}"
        print(json.dumps(run(db, root, args.batches, args.files), indent=2))


if __name__ == "__main__":
    main()
