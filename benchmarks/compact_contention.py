"""A compaction beside batches publishing back to back into the hours it merges.

Prints ONE JSON document on stdout (progress on stderr). No broker and no Spark: a
publisher thread commits a batch (one Parquet file of ``--rows`` rows into one of the
``--hours`` closed hours, in turn) every ``--interval`` seconds, as a backfill catching up
does, exactly as the runtime publishes (``Tables.stage_append`` and ``Store.publish``);
meanwhile ``compact`` (what ``reconciler compact`` runs) merges those hours, with its
default 10 attempts. Each trial starts from a fresh table holding ``--files`` small files.

Two ways, the same trials in turn, in the same run:

* ``product``: a compaction that lost its commit to a batch stages the same merge again
  while every file it planned on is live (``table/ancestry.py``);
* ``replan`` (the baseline, the behaviour before): it plans again at every lost commit,
  so each new file joins its partition's group and the partition is rewritten again.

Reported per way: trials committed and given up ("the table kept moving"), the attempts,
the partitions rewritten (``_rewrite`` calls), the seconds from start to commit, and the
batches published meanwhile. Every trial checks the table holds every row exactly once.
SQLite in a temporary directory by default, ``--db URL`` (a PostgreSQL database) instead.

Usage: ``.venv/bin/python benchmarks/compact_contention.py [--trials 10] [--interval 0.25]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from reconciler.model import PartitionRange, SupervisorSpec  # noqa: E402
from reconciler.store.batches import TableConflict  # noqa: E402
from reconciler.store.store import SegmentFile, Store  # noqa: E402
from reconciler.table import catalog as cat  # noqa: E402
from reconciler.table import compact as compact_module  # noqa: E402
from reconciler.table.writeids import new_write_id  # noqa: E402

SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()),
                    ("__partition", pa.string()), ("__offset", pa.int64())])
T0 = datetime(2026, 11, 20, tzinfo=UTC)
FAR = datetime(2100, 1, 1, tzinfo=UTC)


class Publisher:
    """Batches of one file each, published back to back into the closed hours in turn."""

    def __init__(self, db: str, warehouse: Path, rows: int, hours: int):
        self.store, self.rows, self.hours = Store(db), rows, hours
        self.tables = cat.Tables(self.store.engine, warehouse)
        self.offset, self.batches = 0, 0

    def publish(self) -> None:
        b, lo, hi = self.batches, self.offset, self.offset + self.rows
        hour = T0 + timedelta(hours=b % self.hours)
        batch = new_write_id()
        self.store.begin_write(batch, "batch", tables=["bench"], supervisor_id="bench")
        d = self.tables.data_dir(self.tables.current("bench"), batch) / f"time_chunk={hour:%Y%m%dT%H%MZ}"
        d.mkdir(parents=True)
        path = d / "part-00000.parquet"
        pq.write_table(pa.table({"__time": pa.array([hour + timedelta(seconds=o % 3000) for o in range(lo, hi)],
                                                    pa.timestamp("us", tz="UTC")),
                                 "id": [f"k{o}" for o in range(lo, hi)], "__partition": ["0"] * (hi - lo),
                                 "__offset": pa.array(range(lo, hi), pa.int64())}, schema=SCHEMA), path)
        rng = PartitionRange("0", lo, hi)
        summary = {cat.SUPERVISOR: "bench", cat.BATCH: batch, cat.EPOCH: "1",
                   cat.RANGES: json.dumps([["0", lo, hi]])}
        for attempt in range(20):  # a compaction that committed first: staged again, as the runtime does
            commit = self.tables.stage_append("bench", [str(path)], summary, schema=SCHEMA, granularity="hour",
                                              write_id=batch, attempt=attempt)
            try:
                self.store.publish(supervisor_id="bench", epoch=1, batch_id=batch, datasource="bench", ranges=[rng],
                                   files=[SegmentFile("x", "", "", str(path), hi - lo, 1)], records=hi - lo,
                                   unparseable=0, table_commits=[commit])
            except TableConflict:
                self.tables.discard_staged([commit])
                continue
            self.tables.committed([commit])
            break
        else:
            raise RuntimeError(f"batch {b} not published after 20 stagings")
        self.offset, self.batches = hi, b + 1

    def run(self, interval: float, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.publish()
            stop.wait(max(0.0, interval - (time.monotonic() - started)))


def trial(db: str, root: Path, args, way: str) -> dict:
    store = Store(db)
    store.migrate()
    store.create_supervisor(SupervisorSpec.from_document({
        "id": "bench", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "bench"},
        "dataSchema": {"datasource": "bench", "timestamp": {"column": "ts"}}}), None, actor="bench")
    store.init_checkpoints("bench", {"0": 0})
    warehouse = root / "segments"
    cat.Tables(store.engine, warehouse).ensure("bench", SCHEMA, "hour")
    publisher = Publisher(db, warehouse, args.rows, args.hours)
    for _ in range(args.files):
        publisher.publish()
    before = publisher.batches
    rewrites: list[int] = []
    real_rewrite = compact_module._rewrite

    def counting(table, group, *a, **kw):
        rewrites.append(len(group.tasks))
        return real_rewrite(table, group, *a, **kw)

    compact_module._rewrite = counting
    if way == "replan":  # the plan is made again at every attempt (the staging's own check still runs)
        compact_module.unchanged_for = _never_kept
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(args.interval, stop), daemon=True)
    try:
        thread.start()
        time.sleep(args.interval * 2)  # publishing back to back before the compaction starts
        started = time.monotonic()
        result = compact_module.compact(cat.Tables(store.engine, warehouse), "bench", store=store,
                                        lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
        seconds = time.monotonic() - started
        published_during = publisher.batches - before
    finally:
        stop.set()
        thread.join(60)
        compact_module._rewrite = real_rewrite
        compact_module.unchanged_for = unchanged_for
    ids = Counter(cat.Tables(store.engine, warehouse).current("bench").scan(selected_fields=("id",))
                  .to_arrow().column("id").to_pylist())
    assert len(ids) == publisher.offset and set(ids.values()) == {1}, "a row lost or doubled"
    publisher.store.close()
    store.close()
    return {"committed": result.committed, "gave_up": "kept moving" in result.message,
            "attempts": result.attempts, "rewrites": len(rewrites), "seconds": round(seconds, 3),
            "batches_published_meanwhile": published_during, "files_before": result.files_before,
            "files_after": result.files_after}


def summarize(rows: list[dict]) -> dict:
    committed = [r for r in rows if r["committed"]]
    return {"trials": len(rows), "committed": len(committed), "gave_up": sum(r["gave_up"] for r in rows),
            "attempts_median": statistics.median(r["attempts"] for r in rows),
            "attempts_max": max(r["attempts"] for r in rows),
            "rewrites_median": statistics.median(r["rewrites"] for r in rows),
            "seconds_to_commit_median": round(statistics.median(r["seconds"] for r in committed), 3)
            if committed else None,
            "seconds_median": round(statistics.median(r["seconds"] for r in rows), 3),
            "batches_published_meanwhile_median": statistics.median(r["batches_published_meanwhile"] for r in rows),
            "runs": rows}


unchanged_for = compact_module.unchanged_for


def _never_kept(metadata, io, read_on, paths) -> bool:
    """The baseline: ``compact`` asks whether to keep its plan (never), its staging asks
    whether the files it read are still right (answered as in the product)."""
    if sys._getframe(1).f_code.co_name == "compact":
        return False
    return unchanged_for(metadata, io, read_on, paths)


def _fresh_postgres_schema(db: str) -> None:
    """A PostgreSQL database is emptied between trials (SQLite trials get a new file)."""
    engine = sa.create_engine(db)
    with engine.begin() as c:
        c.exec_driver_sql("DROP SCHEMA public CASCADE")
        c.exec_driver_sql("CREATE SCHEMA public")
    engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10, help="trials per way, alternating (default 10)")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between batches (default 0.25)")
    ap.add_argument("--files", type=int, default=40, help="small files in the table at the start (default 40)")
    ap.add_argument("--rows", type=int, default=20000, help="rows per batch (default 20000)")
    ap.add_argument("--hours", type=int, default=4, help="closed hours the batches go to, in turn (default 4)")
    ap.add_argument("--db", default="", help="SQLAlchemy URL of an empty PostgreSQL database (default: SQLite)")
    args = ap.parse_args()
    out: dict[str, list[dict]] = {"product": [], "replan": []}
    for i in range(args.trials):
        for way in ("product", "replan"):
            with tempfile.TemporaryDirectory(prefix="bench-contention-") as tmp:
                db = args.db or f"sqlite:///{Path(tmp) / 'reconciler.db'}"
                if args.db:
                    _fresh_postgres_schema(db)
                out[way].append(trial(db, Path(tmp), args, way))
            r = out[way][-1]
            print(f"trial {i} {way}: committed={r['committed']} attempts={r['attempts']} rewrites={r['rewrites']} "
                  f"{r['seconds']}s", file=sys.stderr)
    print(json.dumps({"interval_s": args.interval, "rows_per_batch": args.rows, "hours": args.hours,
                      "files_at_start": args.files, "db": (args.db or "sqlite").split(":", 1)[0],
                      "product": summarize(out["product"]), "replan_baseline": summarize(out["replan"])}, indent=2))


if __name__ == "__main__":
    main()
